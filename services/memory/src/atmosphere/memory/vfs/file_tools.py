"""The eight model-facing file tools, run against a `FileSystem`: the exact texts the model sees.

The tools' names, descriptions and argument schemas are the SDK's (`atmosphere.sdk.builtin_tools.
FILE_TOOLS`), the one definition dispatch offers the model; this module only runs them.

Every outcome is a string for the model: success texts, `Error: <message>` for anything the model
can fix, and never an exception for bad input (invariant #4: validate at the boundary, never throw
raw errors back to the model).

Argument coercion: a string is used as is; an int or float is stringified (models sometimes send
`"path": 2024`); any other value (bool, list, object) is `Error: '<name>' must be a string`.

Unknown arguments are refused, as the user tools' schemas refuse them: `ls({"path": "notes"})` is
`Error: ls got an unknown argument 'path' (it takes: dir)`, never a silent listing of the root.
The arguments a tool takes are those of its SDK schema.

Reading in pages: a file may be larger than one bus message can carry (the broker's limit can
be below the store's per-file limit). Then `read_file` returns the part that fits and a marker
naming the `offset` to read on from; `offset` (characters, default 0) is accepted on every read.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Final

from atmosphere.bus.sizes import head, utf8_len
from atmosphere.memory.vfs.filesystem import FileSystem, WorkspaceError
from atmosphere.sdk.builtin_tools import FILE_TOOLS, unknown_arguments
from atmosphere.sdk.runtime import ToolSpec

log = logging.getLogger("atmosphere.memory.file_tools")

UNAVAILABLE: Final = "File tools unavailable: no agent filesystem is bound to this session."

_SPECS: Final[Mapping[str, ToolSpec]] = {spec.name: spec for spec in FILE_TOOLS}
"""The file tools as the model sees them (the SDK's one definition): the arguments each takes."""


class _ArgumentError(Exception):
    """An argument the model must fix; the message follows `Error: `."""


def _refuse_unknown(name: str, arguments: Mapping[str, object]) -> None:
    """Refuse arguments tool `name` does not take (a model's typo, e.g. `ls({"path": ...})`)."""
    problem = unknown_arguments(_SPECS[name], arguments)
    if problem is not None:
        raise _ArgumentError(f"{name} {problem}")


def _argument(arguments: Mapping[str, object], name: str) -> str | None:
    """The argument as a string (None when missing or null)."""
    value = arguments.get(name)
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise _ArgumentError(f"'{name}' must be a string")


def _required(arguments: Mapping[str, object], name: str) -> str:
    """A required argument: missing, null or blank is an error."""
    value = _argument(arguments, name)
    if value is None or not value.strip():
        raise _ArgumentError(f"'{name}' is required")
    return value


def _text(arguments: Mapping[str, object], name: str) -> str:
    """A content argument: missing or null means empty; whitespace is content."""
    return _argument(arguments, name) or ""


def _optional_dir(arguments: Mapping[str, object]) -> str | None:
    value = _argument(arguments, "dir")
    return None if value is None or value.strip() in {"", "."} else value


def _ls(fs: FileSystem, arguments: Mapping[str, object]) -> str:
    entries = fs.ls(_optional_dir(arguments))
    if not entries:
        return "(empty)"
    return "\n".join(f"{entry.path}/" if entry.directory else f"{entry.path} ({entry.size} bytes)" for entry in entries)


def _offset(arguments: Mapping[str, object]) -> int:
    """The `offset` argument: a non-negative whole number of characters (0 when absent)."""
    value = arguments.get("offset")
    if value is None:
        return 0
    try:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError
        offset = int(value)  # a digit string too; over 4300 digits is a ValueError
    except ValueError:
        raise _ArgumentError("'offset' must be a non-negative whole number of characters") from None
    if offset < 0:
        raise _ArgumentError("'offset' must be a non-negative whole number of characters")
    return offset


def _read_file(fs: FileSystem, arguments: Mapping[str, object], *, max_bytes: int | None = None) -> str:
    path = _required(arguments, "path")
    offset = _offset(arguments)
    content = fs.read(path)
    if offset > len(content):
        raise _ArgumentError(f"offset {offset} is past the end of {path} ({len(content)} characters)")
    rest = content[offset:] if offset else content
    if max_bytes is None or utf8_len(rest) <= max_bytes:
        return rest
    return _page(path, content, offset, rest, max_bytes)


def _page(path: str, content: str, offset: int, rest: str, max_bytes: int) -> str:
    """The part of `rest` that fits in `max_bytes`, with a marker saying where to read on."""

    def marker(end: int) -> str:
        return (
            f"\n…[truncated: {path} is {len(content)} characters; this shows characters {offset} to {end}."
            f" Call read_file with offset={end} to read on.]"
        )

    piece = head(rest, max_bytes - utf8_len(marker(len(content))))
    if not piece:
        raise _ArgumentError(f"{path} cannot be read: not even one character fits in a reply")
    return piece + marker(offset + len(piece))


def _write_file(fs: FileSystem, arguments: Mapping[str, object]) -> str:
    path = _required(arguments, "path")
    fs.write(path, _text(arguments, "content"))
    return f"Wrote {path}"


def _edit_file(fs: FileSystem, arguments: Mapping[str, object]) -> str:
    path = _required(arguments, "path")
    old_text = _argument(arguments, "old_text")
    if old_text is None:  # "" reaches the store, which explains that it must not be empty
        raise _ArgumentError("'old_text' is required")
    fs.edit(path, old_text, _text(arguments, "new_text"))
    return f"Edited {path}"


def _glob(fs: FileSystem, arguments: Mapping[str, object]) -> str:
    matches = fs.glob(_required(arguments, "pattern"))
    return "\n".join(matches) if matches else "(no matches)"


def _grep(fs: FileSystem, arguments: Mapping[str, object]) -> str:
    hits = fs.grep(_required(arguments, "pattern"), _optional_dir(arguments))
    return "\n".join(f"{hit.path}:{hit.line}: {hit.text}" for hit in hits) if hits else "(no matches)"


def _delete(fs: FileSystem, arguments: Mapping[str, object]) -> str:
    path = _required(arguments, "path")
    fs.delete(path)
    return f"Deleted {path}"


def _rename(fs: FileSystem, arguments: Mapping[str, object]) -> str:
    old_path = _required(arguments, "old_path")
    new_path = _required(arguments, "new_path")
    fs.rename(old_path, new_path)
    return f"Renamed {old_path} to {new_path}"


_HANDLERS: Final[Mapping[str, Callable[[FileSystem, Mapping[str, object]], str]]] = {
    "ls": _ls,
    "read_file": _read_file,
    "write_file": _write_file,
    "edit_file": _edit_file,
    "glob": _glob,
    "grep": _grep,
    "delete": _delete,
    "rename": _rename,
}


def run_file_tool(
    fs: FileSystem | None, name: str, arguments: Mapping[str, object], *, max_bytes: int | None = None
) -> str:
    """Run one file tool and return the text the model sees; never raises for bad input.

    Echoed paths in success texts are the model's own strings. Unexpected OS errors become
    `Error: <strerror>` (no file names, so nothing outside the store leaks); anything else is
    logged and reported as a generic failure. `max_bytes` bounds what `read_file` returns at
    once (the rest is read with `offset`).
    """
    handler = _HANDLERS.get(name)
    if handler is None:
        return f"Error: unknown file tool '{name}'"
    if fs is None:
        return UNAVAILABLE
    if handler is _read_file:
        handler = functools.partial(_read_file, max_bytes=max_bytes)
    try:
        _refuse_unknown(name, arguments)
        return handler(fs, arguments)
    except (_ArgumentError, WorkspaceError) as exc:
        return f"Error: {exc}"
    except OSError as exc:
        log.warning("File tool %s failed: %s", name, exc)
        return f"Error: {exc.strerror or type(exc).__name__}"
    except Exception:
        log.exception("File tool %s failed unexpectedly", name)
        return f"Error: {name} failed unexpectedly"
