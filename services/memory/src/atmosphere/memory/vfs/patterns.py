"""Model-written search patterns: glob-to-regex translation and deadline-bounded regex matching.

Both `glob` and `grep` run model-written patterns, so both go through the third-party `regex`
engine, whose matching accepts a `timeout`: catastrophic backtracking is cut off at the store's
`grep_deadline` instead of pinning a worker thread (the reference checks the clock inside its
char sequence for the same reason). The stdlib `re` has no such bound.
"""

from __future__ import annotations

from typing import Protocol

# `regex` ships no type stubs; it is used only through the small typed surface below.
import regex  # type: ignore[import-untyped]

from atmosphere.memory.vfs.filesystem import WorkspaceError
from atmosphere.memory.vfs.paths import display


class Matcher(Protocol):
    """The typed surface of a compiled `regex` pattern that the store uses."""

    def search(self, string: str, *, timeout: float) -> object | None: ...

    def fullmatch(self, string: str, *, timeout: float) -> object | None: ...


def compile_glob(pattern: str) -> Matcher:
    """A matcher for relative paths (see `glob_regex` for the syntax); `WorkspaceError` if malformed."""
    try:
        matcher: Matcher = regex.compile(glob_regex(pattern), regex.DOTALL)
    except regex.error as exc:
        raise WorkspaceError(f"Invalid glob pattern: {exc}: {display(pattern)}") from None
    return matcher


def compile_regex(pattern: str) -> Matcher:
    """A matcher for one line of text; `WorkspaceError` if malformed."""
    try:
        matcher: Matcher = regex.compile(pattern)
    except (regex.error, ValueError, OverflowError, RecursionError) as exc:
        raise WorkspaceError(f"Invalid regex pattern: {exc}") from None
    return matcher


def timeout_error(kind: str, pattern: str, deadline: float) -> WorkspaceError:
    """The error for a `glob` or `grep` that ran past its deadline."""
    millis = round(deadline * 1000)
    return WorkspaceError(
        f"{kind} timed out on pattern '{display(pattern)}' — simplify the pattern "
        f"(catastrophic backtracking is cut off after {millis} ms)"
    )


def _glob_class(pattern: str, start: int) -> tuple[str, int]:
    """Translate the `[...]` class opening at `start`; returns (regex, index after `]`)."""
    i = start + 1
    negate = i < len(pattern) and pattern[i] in "!^"
    if negate:
        i += 1
    body: list[str] = []
    first = True
    while i < len(pattern) and (pattern[i] != "]" or first):
        ch = pattern[i]
        first = False
        if ch == "\\" and i + 1 < len(pattern):
            i += 1
            ch = pattern[i]
            body.append(regex.escape(ch))
        elif ch == "-" and body and i + 1 < len(pattern) and pattern[i + 1] != "]":
            body.append("-")
        else:
            body.append(regex.escape(ch))
        i += 1
    if i >= len(pattern):
        raise WorkspaceError(f"Invalid glob pattern: unclosed character class: {display(pattern)}")
    # A class never matches `/`: globs match within one segment.
    inner = "".join(body)
    return (f"[^/{inner}]" if negate else f"(?!/)[{inner}]"), i + 1


def _glob_stars(pattern: str, start: int) -> tuple[str, int]:
    """Translate the run of `*` at `start`; returns (regex, index after it)."""
    end = start
    while end < len(pattern) and pattern[end] == "*":
        end += 1
    if end - start == 1:
        return "[^/]*", end
    if end < len(pattern) and pattern[end] == "/":
        return "(?:.*/)?", end + 1  # `**/`: zero or more whole directories
    return ".*", end


def glob_regex(pattern: str) -> str:
    r"""Translate a glob to a regex over relative paths.

    `**` spans directories (`**/` also matches zero directories, so `**/*.md` matches `a.md`), `*`
    and `?` stay within a segment, `[...]`/`[!...]` are classes, `{a,b}` alternatives (not nested),
    `\x` escapes `x`.
    """
    out: list[str] = []
    in_group = False
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch in "*[":
            translated, i = _glob_stars(pattern, i) if ch == "*" else _glob_class(pattern, i)
            out.append(translated)
            continue
        if ch == "?":
            out.append("[^/]")
        elif ch == "{":
            if in_group:
                raise WorkspaceError(f"Invalid glob pattern: cannot nest groups: {display(pattern)}")
            in_group = True
            out.append("(?:")
        elif ch == "}" and in_group:
            in_group = False
            out.append(")")
        elif ch == "," and in_group:
            out.append("|")
        elif ch == "\\":
            if i + 1 >= len(pattern):
                raise WorkspaceError(f"Invalid glob pattern: no character to escape: {display(pattern)}")
            i += 1
            out.append(regex.escape(pattern[i]))
        else:
            out.append(regex.escape(ch))
        i += 1
    if in_group:
        raise WorkspaceError(f"Invalid glob pattern: missing '}}': {display(pattern)}")
    return "".join(out)


__all__ = ["Matcher", "compile_glob", "compile_regex", "glob_regex", "timeout_error"]
