"""The eight model-facing file tools: their specs and a dispatcher returning the exact tool texts.

Every outcome is a string for the model: success texts, `Error: <message>` for anything the model
can fix, and never an exception for bad input (invariant #4: validate at the boundary, never throw
raw errors back to the model).

Argument coercion: a string is used as is; an int or float is stringified (models sometimes send
`"path": 2024`); any other value (bool, list, object) is `Error: '<name>' must be a string`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from atmosphere.memory.workspace import FileSystem, WorkspaceError

log = logging.getLogger("atmosphere.memory.file_tools")

UNAVAILABLE: Final = "File tools unavailable: no agent filesystem is bound to this session."


@dataclass(frozen=True, slots=True)
class FileToolSpec:
    """One tool as the model sees it."""

    name: str
    description: str
    kind: str
    """`READ`, `EDIT` or `DELETE`: approvals and governance key on it."""
    parameters: Mapping[str, Any]
    """The JSON schema of the arguments."""


def _schema(properties: Mapping[str, str], required: tuple[str, ...]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": "string", "description": text} for name, text in properties.items()},
        "required": list(required),
    }


_PATH = "Path relative to the workspace root, with forward slashes (e.g. notes/todo.md)."

FILE_TOOLS: Final[tuple[FileToolSpec, ...]] = (
    FileToolSpec(
        "ls",
        "List the entries directly under a workspace directory: directories first (shown as `path/`), "
        "then files (shown as `path (N bytes)`). Paths are relative to the workspace root.",
        "READ",
        _schema({"dir": "Directory to list; omit or use `.` for the workspace root."}, ()),
    ),
    FileToolSpec(
        "read_file",
        "Read one workspace file and return its full UTF-8 content.",
        "READ",
        _schema({"path": _PATH}, ("path",)),
    ),
    FileToolSpec(
        "write_file",
        "Create or overwrite a workspace file with the given content; missing parent directories are "
        "created. Use it to stage notes, drafts and intermediate results for multi-step work.",
        "EDIT",
        _schema({"path": _PATH, "content": "The complete new content of the file."}, ("path", "content")),
    ),
    FileToolSpec(
        "edit_file",
        "Replace one exact occurrence of old_text with new_text in a workspace file. old_text must match "
        "exactly once; include enough surrounding context to make it unique.",
        "EDIT",
        _schema(
            {
                "path": _PATH,
                "old_text": "The exact text to replace (must occur exactly once).",
                "new_text": "The replacement text (may be empty to delete old_text).",
            },
            ("path", "old_text", "new_text"),
        ),
    ),
    FileToolSpec(
        "glob",
        "Find workspace files whose path matches a glob pattern: `*` and `?` stay within one directory, "
        "`**` spans directories (e.g. `**/*.md`), `[abc]` and `{a,b}` are supported. Returns sorted paths.",
        "READ",
        _schema({"pattern": "Glob pattern matched against paths relative to the workspace root."}, ("pattern",)),
    ),
    FileToolSpec(
        "grep",
        "Search workspace files for lines matching a regular expression; returns `path:line: text` lines "
        "(at most 500 hits).",
        "READ",
        _schema(
            {
                "pattern": "Regular expression searched in each line.",
                "dir": "Directory (or file) to search; omit to search the whole workspace.",
            },
            ("pattern",),
        ),
    ),
    FileToolSpec(
        "delete",
        "Delete a workspace file, or a directory with everything in it. This cannot be undone.",
        "DELETE",
        _schema({"path": _PATH}, ("path",)),
    ),
    FileToolSpec(
        "rename",
        "Move or rename a workspace file or directory; parent directories of new_path are created. "
        "Fails if new_path already exists.",
        "EDIT",
        _schema({"old_path": "Current path.", "new_path": "New path (must not exist yet)."}, ("old_path", "new_path")),
    ),
)
"""The tools in registration order: ls, read_file, write_file, edit_file, glob, grep, delete, rename."""

FILE_TOOL_NAMES: Final = frozenset(spec.name for spec in FILE_TOOLS)


class _ArgumentError(Exception):
    """An argument the model must fix; the message follows `Error: `."""


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


def _read_file(fs: FileSystem, arguments: Mapping[str, object]) -> str:
    return fs.read(_required(arguments, "path"))


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


def run_file_tool(fs: FileSystem | None, name: str, arguments: Mapping[str, object]) -> str:
    """Run one file tool and return the text the model sees; never raises for bad input.

    Echoed paths in success texts are the model's own strings. Unexpected OS errors become
    `Error: <strerror>` (no file names, so nothing outside the store leaks); anything else is
    logged and reported as a generic failure.
    """
    handler = _HANDLERS.get(name)
    if handler is None:
        return f"Error: unknown file tool '{name}'"
    if fs is None:
        return UNAVAILABLE
    try:
        return handler(fs, arguments)
    except (_ArgumentError, WorkspaceError) as exc:
        return f"Error: {exc}"
    except OSError as exc:
        log.warning("File tool %s failed: %s", name, exc)
        return f"Error: {exc.strerror or type(exc).__name__}"
    except Exception:
        log.exception("File tool %s failed unexpectedly", name)
        return f"Error: {name} failed unexpectedly"
