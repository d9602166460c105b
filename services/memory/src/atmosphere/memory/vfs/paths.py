"""Validation of every name that reaches the disk: model paths, route keys, owners, conversation ids.

This is the first line of the workspace's security model: a model-supplied path is checked here,
as a string, before any I/O. `validate_path` normalizes the string (NFKC) and rejects everything
that is not a plain relative path: blank, control/bidi characters, backslashes, absolute and
drive-letter forms, `.`/`..`/empty segments, over-long segments/paths, too-deep paths. Nothing is
ever URL-decoded, so `..%2fx` is just a file name. Resolution on disk (which must not follow links
either) is `dirfd`'s job; this module never touches the filesystem.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from typing import TypeVar

from atmosphere.memory.vfs.filesystem import WorkspaceError

MAX_SEGMENT_BYTES = 255
"""Longest path segment (UTF-8 bytes): the usual `NAME_MAX`."""
MAX_PATH_BYTES = 4096
"""Longest relative path (UTF-8 bytes): the usual `PATH_MAX`."""
MAX_PATH_DEPTH = 64
"""Most segments in one path; it also bounds the recursion of every tree walk."""

_BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_DRIVE = re.compile(r"[A-Za-z]:")
_OWNER_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def display(text: str, limit: int = 300) -> str:
    """`text` safe to echo: escaped non-printables (no log/line injection), capped length."""
    shown = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)
    return shown if len(shown) <= limit else shown[:limit] + "…"


def validate_path(path: str) -> str:
    """Validate a model-supplied path and return its normalized relative form.

    The string is NFKC-normalized *before* validation and the normalized form is the path used from
    then on (so fullwidth U+FF0E U+FF0E U+FF0F `x` is `../x` and rejected, and fullwidth letters name
    their ASCII twins). Trailing
    slashes are dropped, as Java's `split` does in the reference. Raises `WorkspaceError` otherwise.
    """
    if not isinstance(path, str) or not path.strip():
        raise WorkspaceError("path must not be blank")
    normalized = unicodedata.normalize("NFKC", path)
    for ch in normalized:
        if unicodedata.category(ch) in {"Cc", "Cs"} or ch in _BIDI_CONTROLS:
            msg = f"path contains a control character (U+{ord(ch):04X}): {display(path)}"
            raise WorkspaceError(msg)
    if "\\" in normalized:
        raise WorkspaceError("path must use forward slashes")
    if normalized.startswith("/") or _DRIVE.match(normalized):
        raise WorkspaceError("path must be relative")
    segments = normalized.split("/")
    while segments and not segments[-1]:
        segments.pop()
    for segment in segments:
        # A whitespace-only segment is refused too: it could be created but never named alone.
        if segment in {".", ".."} or not segment.strip():
            raise WorkspaceError(f"path contains an illegal segment ('{segment}'): {display(path)}")
        size = len(segment.encode("utf-8"))
        if size > MAX_SEGMENT_BYTES:
            msg = f"path segment is too long: {size} bytes (limit {MAX_SEGMENT_BYTES}): {display(path, 80)}"
            raise WorkspaceError(msg)
    if len(segments) > MAX_PATH_DEPTH:
        raise WorkspaceError(f"path is too deep: {len(segments)} segments (limit {MAX_PATH_DEPTH})")
    joined = "/".join(segments)
    size = len(joined.encode("utf-8"))
    if size > MAX_PATH_BYTES:
        raise WorkspaceError(f"path is too long: {size} bytes (limit {MAX_PATH_BYTES})")
    return joined


def addressable(name: str) -> bool:
    """Whether an on-disk name can be named by a model path (others are skipped by listings)."""
    try:
        return validate_path(name) == name
    except WorkspaceError:
        return False


def route_key(prefix: str) -> str:
    """A composite route key: the prefix validated like a path, trailing `/` dropped."""
    return validate_path(prefix)


_T = TypeVar("_T")


def keyed_routes(routes: Mapping[str, _T]) -> dict[str, _T]:
    """Routes by validated key; an invalid or duplicate key is a configuration error."""
    keyed: dict[str, _T] = {}
    for prefix, target in routes.items():
        try:
            key = route_key(prefix)
        except WorkspaceError as exc:
            raise ValueError(f"invalid filesystem route {prefix!r}: {exc}") from None
        if key in keyed:
            raise ValueError(f"duplicate filesystem route: {key}")
        keyed[key] = target
    return keyed


def sanitize_owner(owner: str) -> str:
    r"""An owner name as one safe directory name: trim, drop leading `/`/`\`, others → `-`."""
    cleaned = _OWNER_UNSAFE.sub("-", owner.strip().lstrip("/\\"))
    return "default" if not cleaned.strip(".-") else cleaned


def check_conversation_id(conversation_id: str) -> str:
    """A conversation id must be one plain path segment; returns it unchanged."""
    if not isinstance(conversation_id, str) or not conversation_id.strip():
        raise WorkspaceError("conversation id must not be blank")
    illegal = any(ch in conversation_id for ch in "/\\") or ".." in conversation_id
    if illegal or not addressable(conversation_id):
        raise WorkspaceError(f"conversation id contains illegal path characters: {display(conversation_id)}")
    return conversation_id


__all__ = [
    "MAX_PATH_BYTES",
    "MAX_PATH_DEPTH",
    "MAX_SEGMENT_BYTES",
    "addressable",
    "check_conversation_id",
    "display",
    "keyed_routes",
    "route_key",
    "sanitize_owner",
    "validate_path",
]
