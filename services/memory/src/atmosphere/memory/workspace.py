"""The agent's bounded, traversal-proof virtual filesystem (the store behind the eight file tools).

Layout: `{workspace_root}/{agents|coordinators|endpoints}/{owner}/files/{conversation_id}/` holds one
conversation's files; a routed prefix (`LLM_FILESYSTEM_ROUTES`) lives at `{dir}/files/shared/` and is
shared by every conversation.

Security model, in the order a model-supplied path meets it:

1. `validate_path` normalizes the string (NFKC) and rejects everything that is not a plain relative
   path: blank, control/bidi characters, backslashes, absolute and drive-letter forms, `.`/`..`/empty
   segments, over-long segments/paths, too-deep paths. Nothing is ever URL-decoded, so `..%2fx` is
   just a file name.
2. Resolution is fd-relative and never follows a link: the store root is opened as a directory fd
   and every component is opened beneath its parent's fd with `O_NOFOLLOW`. There is no
   realpath-then-open step for an attacker to race (the `filepath-securejoin` TOCTOU class). A link
   anywhere on the way is refused; so are FIFOs, devices and hard-linked files (see `_check_regular`).
3. Writes go to a temp file in the target's directory fd and are `rename`d into place, so a planted
   link at the destination is replaced, never written through.
4. Every mutation runs under one lock per store root, shared by every `WorkspaceFileSystem` instance
   for that root in this process, with the file/byte/directory accounting that enforces the bounds.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import stat
import threading
import time
import unicodedata
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

# `regex` ships no type stubs; it is used only through the small typed surface below.
import regex  # type: ignore[import-untyped]

log = logging.getLogger("atmosphere.memory.workspace")

KIB = 1024
MIB = 1024 * KIB
MAX_SEGMENT_BYTES = 255
"""Longest path segment (UTF-8 bytes): the usual `NAME_MAX`."""
MAX_PATH_BYTES = 4096
"""Longest relative path (UTF-8 bytes): the usual `PATH_MAX`."""
MAX_PATH_DEPTH = 64
"""Most segments in one path; it also bounds the recursion of every tree walk."""
CATEGORIES = ("agents", "coordinators", "endpoints")
"""Owner categories under the workspace root."""
DEFAULT_OFFLOAD_THRESHOLD = 8000
"""A tool result longer than this many chars is offloaded to the filesystem."""
OFFLOAD_PREVIEW_CHARS = 1500
"""How much of an offloaded result the model still sees inline."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO for reading must not wait for a writer (it is refused right after).
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_DRIVE = re.compile(r"[A-Za-z]:")


class WorkspaceError(Exception):
    """A rejected file operation; `str(error)` is what the model sees after `Error: `."""


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds of one store (one conversation, or one routed backend)."""

    max_file_bytes: int = 512 * KIB
    max_files: int = 256
    max_total_bytes: int = 16 * MIB
    max_conversations: int = 256
    """Conversation stores per owner; the least recently modified idle ones are deleted past it."""
    max_grep_hits: int = 500
    grep_line_chars: int = 500
    max_pattern_chars: int = 512
    grep_deadline: float = 2.0
    """Seconds one grep (or glob) may spend matching, across all files."""
    max_dirs: int = 1024
    """Directories per store, so write-then-delete cannot pile up empty directories forever."""


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class Entry:
    """One `ls` line: a path relative to the store root."""

    path: str
    size: int
    directory: bool


@dataclass(frozen=True, slots=True)
class Hit:
    """One grep match; `text` is already truncated to the line limit."""

    path: str
    line: int
    text: str


class FileSystem(Protocol):
    """What the file tools need from a store (a single workspace or a composite of them)."""

    def ls(self, directory: str | None = None) -> list[Entry]:
        """Entries directly under `directory` (the root when None/blank/`.`)."""
        ...

    def read(self, path: str) -> str:
        """A file's UTF-8 content."""
        ...

    def write(self, path: str, content: str) -> None:
        """Create or replace a file, creating its parents."""
        ...

    def edit(self, path: str, old_text: str, new_text: str) -> None:
        """Replace the single occurrence of `old_text`."""
        ...

    def glob(self, pattern: str) -> list[str]:
        """Files matching a glob, sorted."""
        ...

    def grep(self, pattern: str, directory: str | None = None) -> list[Hit]:
        """Lines matching a regex, files in sorted order."""
        ...

    def delete(self, path: str) -> None:
        """Remove a file or a whole directory tree."""
        ...

    def rename(self, old_path: str, new_path: str) -> None:
        """Move a file or directory; the destination must not exist."""
        ...

    def usage(self) -> tuple[int, int]:
        """(files, bytes) held."""
        ...


# --------------------------------------------------------------------------------------------------
# Path validation


def _display(text: str, limit: int = 300) -> str:
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
            msg = f"path contains a control character (U+{ord(ch):04X}): {_display(path)}"
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
            raise WorkspaceError(f"path contains an illegal segment ('{segment}'): {_display(path)}")
        size = len(segment.encode("utf-8"))
        if size > MAX_SEGMENT_BYTES:
            msg = f"path segment is too long: {size} bytes (limit {MAX_SEGMENT_BYTES}): {_display(path, 80)}"
            raise WorkspaceError(msg)
    if len(segments) > MAX_PATH_DEPTH:
        raise WorkspaceError(f"path is too deep: {len(segments)} segments (limit {MAX_PATH_DEPTH})")
    joined = "/".join(segments)
    size = len(joined.encode("utf-8"))
    if size > MAX_PATH_BYTES:
        raise WorkspaceError(f"path is too long: {size} bytes (limit {MAX_PATH_BYTES})")
    return joined


def _addressable(name: str) -> bool:
    """Whether an on-disk name can be named by a model path (others are skipped by listings)."""
    try:
        return validate_path(name) == name
    except WorkspaceError:
        return False


def route_key(prefix: str) -> str:
    """A composite route key: the prefix validated like a path, trailing `/` dropped."""
    return validate_path(prefix)


_T = TypeVar("_T")


def _keyed_routes(routes: Mapping[str, _T]) -> dict[str, _T]:
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


# --------------------------------------------------------------------------------------------------
# Per-root shared state: one lock + accounting per store root in this process


@dataclass(slots=True)
class _Usage:
    files: int = 0
    bytes: int = 0
    dirs: int = 0


class _StoreState:
    """The lock and accounting that every instance for one root shares (held weakly by the registry)."""

    __slots__ = ("__weakref__", "lock", "usage")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.usage: _Usage | None = None


_states: weakref.WeakValueDictionary[str, _StoreState] = weakref.WeakValueDictionary()
_states_lock = threading.Lock()


def _root_key(root: Path | str) -> str:
    """A canonical key for a root: its parent's real path plus its own name (not followed)."""
    absolute = os.path.abspath(root)
    return os.path.join(os.path.realpath(os.path.dirname(absolute)), os.path.basename(absolute))


def _state_for(key: str) -> _StoreState:
    with _states_lock:
        state = _states.get(key)
        if state is None:
            state = _StoreState()
            _states[key] = state
        return state


def _live_state(key: str) -> _StoreState | None:
    with _states_lock:
        return _states.get(key)


# --------------------------------------------------------------------------------------------------
# fd-level helpers (no paths beyond one name relative to a directory fd)


def _link_error(display: str) -> WorkspaceError:
    return WorkspaceError(f"Path escapes the store root via a link: {display}")


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _check_regular(st: os.stat_result, display: str) -> None:
    """Refuse anything but a plain, singly-linked regular file.

    Hard links are refused because a hard link is indistinguishable by path from a regular file and
    may share its inode with a file outside the store; our own writes (temp file + rename) always
    produce `st_nlink == 1`, so `> 1` means something outside the tools planted it.
    """
    if stat.S_ISLNK(st.st_mode):
        raise _link_error(display)
    if stat.S_ISDIR(st.st_mode):
        raise WorkspaceError(f"Is a directory: {display}")
    if not stat.S_ISREG(st.st_mode):
        raise WorkspaceError(f"Not a regular file: {display}")
    if st.st_nlink > 1:
        raise _link_error(display)


def _read_all(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while total < limit:
        chunk = os.read(fd, min(1 << 20, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _remove_tree(parent_fd: int, name: str) -> _Usage:
    """Delete directory `name` under `parent_fd`, children first, never following a link.

    Returns what was removed (regular files, their bytes, directories including this one).
    """
    removed = _Usage()
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    try:
        with os.scandir(fd) as entries:
            children = list(entries)
        for child in children:
            st = _lstat(fd, child.name)
            if st is None:
                continue
            if stat.S_ISDIR(st.st_mode):
                sub = _remove_tree(fd, child.name)
                removed.files += sub.files
                removed.bytes += sub.bytes
                removed.dirs += sub.dirs
                continue
            # Links, FIFOs and devices are unlinked as entries: unlink never touches a target.
            os.unlink(child.name, dir_fd=fd)
            if stat.S_ISREG(st.st_mode):
                removed.files += 1
                removed.bytes += st.st_size
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)
    removed.dirs += 1
    return removed


@dataclass(frozen=True, slots=True)
class _Node:
    path: str
    st: os.stat_result
    directory: bool


def _walk(dir_fd: int, prefix: str, depth: int) -> Iterator[_Node]:
    """Every directory and regular file under `dir_fd`, depth-first in name order; links skipped."""
    with os.scandir(dir_fd) as entries:
        names = sorted(entry.name for entry in entries)
    for name in names:
        st = _lstat(dir_fd, name)
        if st is None:
            continue
        path = f"{prefix}/{name}" if prefix else name
        if stat.S_ISREG(st.st_mode):
            yield _Node(path, st, directory=False)
        elif stat.S_ISDIR(st.st_mode):
            yield _Node(path, st, directory=True)
            if depth + 1 >= MAX_PATH_DEPTH:
                continue
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
            except OSError:
                continue  # vanished, or swapped for a link since the lstat: skip it
            try:
                yield from _walk(child, path, depth + 1)
            finally:
                os.close(child)


def _timeout_error(kind: str, pattern: str, deadline: float) -> WorkspaceError:
    millis = round(deadline * 1000)
    return WorkspaceError(
        f"{kind} timed out on pattern '{_display(pattern)}' — simplify the pattern "
        f"(catastrophic backtracking is cut off after {millis} ms)"
    )


class _Matcher(Protocol):
    def search(self, string: str, *, timeout: float) -> object | None: ...

    def fullmatch(self, string: str, *, timeout: float) -> object | None: ...


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
        raise WorkspaceError(f"Invalid glob pattern: unclosed character class: {_display(pattern)}")
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


def _glob_regex(pattern: str) -> str:
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
                raise WorkspaceError(f"Invalid glob pattern: cannot nest groups: {_display(pattern)}")
            in_group = True
            out.append("(?:")
        elif ch == "}" and in_group:
            in_group = False
            out.append(")")
        elif ch == "," and in_group:
            out.append("|")
        elif ch == "\\":
            if i + 1 >= len(pattern):
                raise WorkspaceError(f"Invalid glob pattern: no character to escape: {_display(pattern)}")
            i += 1
            out.append(regex.escape(pattern[i]))
        else:
            out.append(regex.escape(ch))
        i += 1
    if in_group:
        raise WorkspaceError(f"Invalid glob pattern: missing '}}': {_display(pattern)}")
    return "".join(out)


def _split_lines(text: str) -> list[str]:
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines and not lines[-1]:
        lines.pop()
    return lines


def _count_occurrences(content: str, needle: str) -> int:
    """Occurrences of `needle`, overlapping ones included, so `aa` in `aaa` is ambiguous (2)."""
    count = 0
    index = content.find(needle)
    while index >= 0:
        count += 1
        index = content.find(needle, index + 1)
    return count


def _encode(content: str) -> bytes:
    try:
        return content.encode("utf-8")
    except UnicodeEncodeError:
        raise WorkspaceError("content is not valid Unicode text (it has an unpaired surrogate)") from None


# --------------------------------------------------------------------------------------------------
# The store


class WorkspaceFileSystem:
    """One bounded store rooted at a directory; see the module docstring for the security model.

    Reads are lock-free (writes are atomic renames, so a reader sees the old or the new file).
    Mutations take the per-root lock shared by every instance for the same root in this process.
    The root directory is created on the first write; until then the store reads as empty.
    """

    def __init__(
        self,
        root: Path,
        limits: Limits = DEFAULT_LIMITS,
        *,
        on_create: Callable[[], None] | None = None,
    ) -> None:
        """Bind a store to `root`.

        Args:
            root: The store root directory (trusted configuration; its last component must not be
                a link).
            limits: The store's bounds.
            on_create: Called under the store lock just before the root directory is created.
        """
        self._root = _root_key(root)
        self._limits = limits
        self._on_create = on_create
        self._state = _state_for(self._root)

    @property
    def root(self) -> Path:
        """The store root."""
        return Path(self._root)

    @property
    def limits(self) -> Limits:
        """The store's bounds."""
        return self._limits

    # ---- resolution

    def _open_root(self, *, create: bool) -> int | None:
        try:
            return os.open(self._root, _DIR_FLAGS)
        except FileNotFoundError:
            if not create:
                return None
        except OSError as exc:
            if exc.errno in {errno.ENOTDIR, errno.ELOOP}:  # a file or a link where the root should be
                raise WorkspaceError("the store root is not a plain directory") from None
            raise
        if self._on_create is not None:
            self._on_create()
        os.makedirs(self._root, exist_ok=True)
        return os.open(self._root, _DIR_FLAGS)

    def _open_child_dir(self, parent_fd: int, name: str, rel: str, display: str, *, create: bool) -> int | None:
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except FileNotFoundError:
            if not create:
                return None
        except OSError as exc:
            raise self._classify(parent_fd, name, rel, display, exc) from None
        self._make_dir(parent_fd, name)
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except OSError as exc:
            raise self._classify(parent_fd, name, rel, display, exc) from None

    @staticmethod
    def _classify(parent_fd: int, name: str, rel: str, display: str, exc: OSError) -> Exception:
        """Map a failed directory open to the model-facing error."""
        if exc.errno not in {errno.ENOTDIR, errno.ELOOP}:
            return exc
        st = _lstat(parent_fd, name)
        if st is None or stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode):
            # A link, or an entry that changed under us (only a link swap does that): fail closed.
            return _link_error(display)
        return WorkspaceError(f"Not a directory: {rel}")

    def _make_dir(self, parent_fd: int, name: str) -> None:
        usage = self._usage_locked()
        if usage.dirs >= self._limits.max_dirs:
            msg = (
                f"Write rejected: the store already holds {usage.dirs} directories, "
                f"at the {self._limits.max_dirs}-directory limit"
            )
            raise WorkspaceError(msg)
        try:
            os.mkdir(name, 0o755, dir_fd=parent_fd)
        except FileExistsError:
            return
        usage.dirs += 1

    def _walk_dirs(self, root_fd: int, segments: list[str], display: str, *, create: bool) -> int | None:
        """Open the directory `segments` beneath `root_fd` one component at a time (None: missing)."""
        fd = os.dup(root_fd)
        try:
            for index, name in enumerate(segments):
                rel = "/".join(segments[: index + 1])
                child = self._open_child_dir(fd, name, rel, display, create=create)
                if child is None:
                    return None
                os.close(fd)
                fd = child
            result, fd = fd, -1
            return result
        finally:
            if fd >= 0:
                os.close(fd)

    def _open_parent(self, segments: list[str], display: str, *, create: bool = False) -> int | None:
        """The directory fd holding the last segment (None when the root or a parent is missing)."""
        root_fd = self._open_root(create=create)
        if root_fd is None:
            return None
        try:
            return self._walk_dirs(root_fd, segments[:-1], display, create=create)
        finally:
            os.close(root_fd)

    def _open_file(self, norm: str) -> tuple[int, os.stat_result] | None:
        """Open a regular file for reading (None when missing)."""
        segments = norm.split("/")
        parent = self._open_parent(segments, norm)
        if parent is None:
            return None
        try:
            name = segments[-1]
            before = _lstat(parent, name)
            if before is None:
                return None
            _check_regular(before, norm)  # refuse devices/FIFOs before opening them at all
            try:
                fd = os.open(name, _READ_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise _link_error(norm) from None
                raise
            try:
                st = os.fstat(fd)
                _check_regular(st, norm)  # the entry may have been swapped since the lstat
            except BaseException:
                os.close(fd)
                raise
            return fd, st
        finally:
            os.close(parent)

    # ---- accounting

    def _usage_locked(self) -> _Usage:
        """The store's accounting, computed by one walk the first time (caller holds the lock)."""
        if self._state.usage is None:
            usage = _Usage()
            root_fd = self._open_root(create=False)
            if root_fd is not None:
                try:
                    for node in _walk(root_fd, "", 0):
                        if node.directory:
                            usage.dirs += 1
                        else:
                            usage.files += 1
                            usage.bytes += node.st.st_size
                finally:
                    os.close(root_fd)
            self._state.usage = usage
        return self._state.usage

    def usage(self) -> tuple[int, int]:
        """(files, bytes) held by the store."""
        with self._state.lock:
            usage = self._usage_locked()
            return usage.files, usage.bytes

    def _touch_root(self) -> None:
        """Bump the root's mtime: the provider evicts the least recently modified conversation."""
        with contextlib.suppress(OSError):
            os.utime(self._root, follow_symlinks=False)

    # ---- reads

    def ls(self, directory: str | None = None) -> list[Entry]:
        """Entries directly under `directory`: directories first, then files, each sorted by path.

        A missing directory lists as empty; links, FIFOs and devices are not listed.
        """
        if directory is None or directory.strip() in {"", "."}:
            segments: list[str] = []
            prefix = ""
        else:
            prefix = validate_path(directory)
            segments = prefix.split("/")
        root_fd = self._open_root(create=False)
        if root_fd is None:
            return []
        try:
            fd = self._walk_dirs(root_fd, segments, prefix, create=False)
        finally:
            os.close(root_fd)
        if fd is None:
            return []
        entries: list[Entry] = []
        try:
            with os.scandir(fd) as it:
                names = [entry.name for entry in it]
            for name in names:
                st = _lstat(fd, name)
                if st is None or not _addressable(name):
                    continue
                path = f"{prefix}/{name}" if prefix else name
                if stat.S_ISDIR(st.st_mode):
                    entries.append(Entry(path, 0, directory=True))
                elif stat.S_ISREG(st.st_mode):
                    entries.append(Entry(path, st.st_size, directory=False))
        finally:
            os.close(fd)
        return sorted(entries, key=lambda entry: (not entry.directory, entry.path))

    def read(self, path: str) -> str:
        """A file's full UTF-8 content."""
        norm = validate_path(path)
        opened = self._open_file(norm)
        if opened is None:
            raise WorkspaceError(f"File not found: {norm}")
        fd, st = opened
        limit = self._limits.max_file_bytes
        try:
            if st.st_size > limit:
                raise WorkspaceError(f"File too large to read: {norm} is {st.st_size} bytes (limit {limit})")
            data = _read_all(fd, limit + 1)
        finally:
            os.close(fd)
        if len(data) > limit:
            raise WorkspaceError(f"File too large to read: {norm} is over {limit} bytes (limit {limit})")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise WorkspaceError(f"File is not UTF-8 text: {norm}") from None

    def _files_under(self, segments: list[str], display: str) -> list[str]:
        """Regular files under a directory (or the one file `segments` names), sorted by path."""
        if not segments:
            root_fd = self._open_root(create=False)
            return [] if root_fd is None else self._files_in(root_fd, "", 0)
        parent = self._open_parent(segments, display)
        if parent is None:
            return []
        try:
            st = _lstat(parent, segments[-1])
            if st is None:
                return []
            if stat.S_ISLNK(st.st_mode):
                raise _link_error(display)
            if stat.S_ISREG(st.st_mode):
                return [display]
            if not stat.S_ISDIR(st.st_mode):
                return []
            try:
                fd = os.open(segments[-1], _DIR_FLAGS, dir_fd=parent)
            except OSError as exc:
                raise self._classify(parent, segments[-1], display, display, exc) from None
        finally:
            os.close(parent)
        return self._files_in(fd, display, len(segments))

    @staticmethod
    def _files_in(fd: int, prefix: str, depth: int) -> list[str]:
        """Regular files under directory `fd` (which is closed), sorted by path."""
        try:
            return sorted(node.path for node in _walk(fd, prefix, depth) if not node.directory)
        finally:
            os.close(fd)

    def glob(self, pattern: str) -> list[str]:
        """Files whose relative path matches `pattern`, sorted (see `_glob_regex` for the syntax)."""
        if not isinstance(pattern, str) or not pattern.strip():
            raise WorkspaceError("pattern must not be blank")
        pattern = unicodedata.normalize("NFKC", pattern)
        self._check_pattern_length(pattern)
        try:
            matcher: _Matcher = regex.compile(_glob_regex(pattern), regex.DOTALL)
        except regex.error as exc:
            raise WorkspaceError(f"Invalid glob pattern: {exc}: {_display(pattern)}") from None
        deadline = time.monotonic() + self._limits.grep_deadline
        matches: list[str] = []
        try:
            for path in self._files_under([], ""):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                if _addressable(path) and matcher.fullmatch(path, timeout=remaining) is not None:
                    matches.append(path)
        except TimeoutError:
            raise _timeout_error("glob", pattern, self._limits.grep_deadline) from None
        return matches

    def _check_pattern_length(self, pattern: str) -> None:
        if len(pattern) > self._limits.max_pattern_chars:
            raise WorkspaceError(f"Pattern too long: {len(pattern)} chars (limit {self._limits.max_pattern_chars})")

    def grep(self, pattern: str, directory: str | None = None) -> list[Hit]:
        """Lines matching the regex `pattern`, in files walked in sorted path order.

        `directory` scopes the search (a file path searches that one file). At most
        `max_grep_hits` hits; line text is cut at `grep_line_chars` plus `…`; the whole search
        must finish within `grep_deadline`. Links, hard-linked, over-size and non-UTF-8 (binary)
        files are skipped.
        """
        if not isinstance(pattern, str) or not pattern:
            raise WorkspaceError("pattern must not be blank")
        self._check_pattern_length(pattern)
        try:
            matcher: _Matcher = regex.compile(pattern)
        except (regex.error, ValueError, OverflowError, RecursionError) as exc:
            raise WorkspaceError(f"Invalid regex pattern: {exc}") from None
        if directory is None or directory.strip() in {"", "."}:
            scope, segments = "", []
        else:
            scope = validate_path(directory)
            segments = scope.split("/")
        deadline = time.monotonic() + self._limits.grep_deadline
        hits: list[Hit] = []
        try:
            for path in self._files_under(segments, scope):
                for number, line in enumerate(self._grep_lines(path), start=1):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError
                    if matcher.search(line, timeout=remaining) is not None:
                        hits.append(Hit(path, number, self._clip(line)))
                        if len(hits) >= self._limits.max_grep_hits:
                            return hits
        except TimeoutError:
            raise _timeout_error("grep", pattern, self._limits.grep_deadline) from None
        return hits

    def _grep_lines(self, path: str) -> list[str]:
        """A file's lines, or nothing for files grep skips (links, special, over-size, binary)."""
        limit = self._limits.max_file_bytes
        try:
            opened = self._open_file(path) if _addressable(path) else None
        except WorkspaceError:
            opened = None
        if opened is None:
            return []
        fd, st = opened
        try:
            data = _read_all(fd, limit + 1) if st.st_size <= limit else b""
        finally:
            os.close(fd)
        try:
            text = data.decode("utf-8") if len(data) <= limit and b"\x00" not in data else ""
        except UnicodeDecodeError:
            text = ""
        return _split_lines(text)

    def _clip(self, line: str) -> str:
        limit = self._limits.grep_line_chars
        return line if len(line) <= limit else line[:limit] + "…"

    # ---- mutations

    def write(self, path: str, content: str) -> None:
        """Create or replace a file (parents created), within the store's bounds."""
        norm = validate_path(path)
        data = _encode(content)
        with self._state.lock:
            self._write_locked(norm, data)

    def _write_locked(self, norm: str, data: bytes) -> None:
        limits = self._limits
        if len(data) > limits.max_file_bytes:
            size, limit = len(data), limits.max_file_bytes
            msg = f"Write rejected: {norm} would be {size} bytes, over the {limit}-byte per-file limit"
            raise WorkspaceError(msg)
        usage = self._usage_locked()
        segments = norm.split("/")
        parent = self._open_parent(segments, norm)
        try:
            existing: int | None = None
            if parent is not None:
                st = _lstat(parent, segments[-1])
                if st is not None:
                    _check_regular(st, norm)
                    existing = st.st_size
            if existing is None and usage.files >= limits.max_files:
                msg = (
                    f"Write rejected: the store already holds {usage.files} files, at the {limits.max_files}-file limit"
                )
                raise WorkspaceError(msg)
            projected = usage.bytes - (existing or 0) + len(data)
            if projected > limits.max_total_bytes:
                msg = (
                    f"Write rejected: {norm} would bring the store to {projected} bytes, "
                    f"over the {limits.max_total_bytes}-byte total limit"
                )
                raise WorkspaceError(msg)
            if parent is None:
                parent = self._open_parent(segments, norm, create=True)
                if parent is None:  # pragma: no cover - create=True never answers None
                    raise WorkspaceError(f"File not found: {norm}")
            self._replace(parent, segments[-1], data)
        finally:
            if parent is not None:
                os.close(parent)
        usage.bytes = projected
        if existing is None:
            usage.files += 1
        self._touch_root()

    @staticmethod
    def _replace(parent_fd: int, name: str, data: bytes) -> None:
        """Atomically put `data` at `name`: temp file in the same directory, fsync, rename."""
        temp = f".atmo-{uuid.uuid4().hex}.tmp"
        fd = os.open(temp, _TEMP_FLAGS, 0o644, dir_fd=parent_fd)
        try:
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            # rename(2) replaces the destination entry itself: a link planted there is never followed.
            os.rename(temp, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=parent_fd)
            raise

    def edit(self, path: str, old_text: str, new_text: str) -> None:
        """Replace the one occurrence of `old_text` (overlaps count as occurrences) with `new_text`."""
        norm = validate_path(path)
        if not old_text:
            raise WorkspaceError("oldText must not be empty")
        with self._state.lock:
            content = self.read(norm)
            count = _count_occurrences(content, old_text)
            if count == 0:
                raise WorkspaceError(f"oldText not found in {norm} — nothing was changed")
            if count > 1:
                msg = (
                    f"oldText matches {count} times in {norm} — it must match exactly once; "
                    "include more surrounding context"
                )
                raise WorkspaceError(msg)
            self._write_locked(norm, _encode(content.replace(old_text, new_text, 1)))

    def delete(self, path: str) -> None:
        """Remove a file, or a whole directory tree (children first). No bounds apply."""
        norm = validate_path(path)
        segments = norm.split("/")
        with self._state.lock:
            usage = self._usage_locked()
            parent = self._open_parent(segments, norm)
            if parent is None:
                raise WorkspaceError(f"Not found: {norm}")
            try:
                st = _lstat(parent, segments[-1])
                if st is None:
                    raise WorkspaceError(f"Not found: {norm}")
                if stat.S_ISLNK(st.st_mode):
                    raise _link_error(norm)
                if stat.S_ISDIR(st.st_mode):
                    removed = _remove_tree(parent, segments[-1])
                else:
                    os.unlink(segments[-1], dir_fd=parent)
                    regular = stat.S_ISREG(st.st_mode)
                    removed = _Usage(files=int(regular), bytes=st.st_size if regular else 0)
            finally:
                os.close(parent)
            usage.files -= removed.files
            usage.bytes -= removed.bytes
            usage.dirs -= removed.dirs
            self._touch_root()

    def rename(self, old_path: str, new_path: str) -> None:
        """Move a file or directory; destination parents are created, an existing destination refused."""
        old = validate_path(old_path)
        new = validate_path(new_path)
        old_segments, new_segments = old.split("/"), new.split("/")
        with self._state.lock:
            self._usage_locked()
            src_parent = self._open_parent(old_segments, old)
            if src_parent is None:
                raise WorkspaceError(f"Not found: {old}")
            try:
                st = _lstat(src_parent, old_segments[-1])
                if st is None:
                    raise WorkspaceError(f"Not found: {old}")
                if stat.S_ISLNK(st.st_mode):
                    raise _link_error(old)
                is_dir = stat.S_ISDIR(st.st_mode)
                if is_dir and (new == old or new.startswith(old + "/")):
                    raise WorkspaceError(f"Cannot move {old} into itself ({new})")
                if is_dir:
                    self._check_moved_tree(src_parent, old_segments[-1], new)
                self._rename_into(src_parent, old_segments[-1], new_segments, new)
            finally:
                os.close(src_parent)
            self._touch_root()

    def _rename_into(self, src_parent: int, name: str, new_segments: list[str], new: str) -> None:
        exists_msg = f"Destination already exists: {new} — delete it first if you want to replace it"
        dst_parent = self._open_parent(new_segments, new)
        try:
            if dst_parent is not None and _lstat(dst_parent, new_segments[-1]) is not None:
                raise WorkspaceError(exists_msg)
            if dst_parent is None:
                dst_parent = self._open_parent(new_segments, new, create=True)
                if dst_parent is None:  # pragma: no cover - create=True never answers None
                    raise WorkspaceError(f"Not found: {new}")
            # Only an out-of-band writer could plant the destination between the check and here
            # (we hold the store lock); rename(2) would then replace that entry, never follow it.
            os.rename(name, new_segments[-1], src_dir_fd=src_parent, dst_dir_fd=dst_parent)
        finally:
            if dst_parent is not None:
                os.close(dst_parent)

    @staticmethod
    def _check_moved_tree(parent_fd: int, name: str, new: str) -> None:
        """A moved directory must keep every path inside it within the depth and length limits."""
        depth, longest = 0, 0
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        try:
            for node in _walk(fd, "", 0):
                depth = max(depth, node.path.count("/") + 1)
                longest = max(longest, len(node.path.encode("utf-8")) + 1)
        finally:
            os.close(fd)
        new_depth = new.count("/") + 1 + depth
        if new_depth > MAX_PATH_DEPTH:
            raise WorkspaceError(
                f"Rename rejected: {new} would nest the tree {new_depth} levels deep (limit {MAX_PATH_DEPTH})"
            )
        new_length = len(new.encode("utf-8")) + longest
        if new_length > MAX_PATH_BYTES:
            raise WorkspaceError(
                f"Rename rejected: paths under {new} would be {new_length} bytes (limit {MAX_PATH_BYTES})"
            )

    def reset(self) -> None:
        """Forget the cached accounting (after the tree was changed behind the store's back)."""
        with self._state.lock:
            self._state.usage = None


# --------------------------------------------------------------------------------------------------
# Composite routing


class CompositeFileSystem:
    """One flat namespace over a default store and prefix-routed stores.

    A path routes to the longest route key it equals or lies under (segment-aware: `memory` does
    not route `memoryx`); the path is passed on unchanged. Root `ls`, `glob` and root `grep` fan out.
    """

    def __init__(self, default: FileSystem, routes: Mapping[str, FileSystem], *, max_grep_hits: int = 500) -> None:
        """Validate the route keys (like paths, one trailing `/` dropped; duplicates rejected)."""
        keyed = _keyed_routes(routes)
        self._default = default
        self._routes = sorted(keyed.items(), key=lambda item: len(item[0]), reverse=True)
        self._max_grep_hits = max_grep_hits
        backends: list[FileSystem] = [default]
        for backend in keyed.values():
            if all(backend is not seen for seen in backends):
                backends.append(backend)
        self._backends = backends

    def _route_norm(self, norm: str) -> FileSystem:
        for key, backend in self._routes:
            if norm == key or norm.startswith(key + "/"):
                return backend
        return self._default

    def route(self, path: str) -> FileSystem:
        """The backend `path` routes to (the path is validated first)."""
        return self._route_norm(validate_path(path))

    def _spans_routes(self, norm: str) -> bool:
        """Whether some route key lies strictly beneath `norm` (a subtree split across backends)."""
        return any(key.startswith(norm + "/") for key, _ in self._routes)

    def ls(self, directory: str | None = None) -> list[Entry]:
        """Root: every backend's root entries merged (first wins); scoped: the routed backend's."""
        if directory is not None and directory.strip() not in {"", "."}:
            return self.route(directory).ls(directory)
        merged: dict[str, Entry] = {}
        for backend in self._backends:
            for entry in backend.ls(None):
                merged.setdefault(entry.path, entry)
        return sorted(merged.values(), key=lambda entry: (not entry.directory, entry.path))

    def read(self, path: str) -> str:
        """Read from the routed backend."""
        return self.route(path).read(path)

    def write(self, path: str, content: str) -> None:
        """Write to the routed backend."""
        self.route(path).write(path, content)

    def edit(self, path: str, old_text: str, new_text: str) -> None:
        """Edit in the routed backend."""
        self.route(path).edit(path, old_text, new_text)

    def glob(self, pattern: str) -> list[str]:
        """Every backend's matches that route back to it, deduplicated and sorted."""
        found: set[str] = set()
        for backend in self._backends:
            found.update(path for path in backend.glob(pattern) if self._route_norm(path) is backend)
        return sorted(found)

    def grep(self, pattern: str, directory: str | None = None) -> list[Hit]:
        """Root: every backend's hits (that route back to it), concatenated; scoped: one backend."""
        if directory is not None and directory.strip() not in {"", "."}:
            return self.route(directory).grep(pattern, directory)
        hits: list[Hit] = []
        for backend in self._backends:
            hits.extend(hit for hit in backend.grep(pattern) if self._route_norm(hit.path) is backend)
            if len(hits) >= self._max_grep_hits:
                return hits[: self._max_grep_hits]
        return hits

    def delete(self, path: str) -> None:
        """Delete in the routed backend."""
        self.route(path).delete(path)

    def rename(self, old_path: str, new_path: str) -> None:
        """Rename within one backend; a rename spanning backends fails loud."""
        old, new = validate_path(old_path), validate_path(new_path)
        source, target = self._route_norm(old), self._route_norm(new)
        if source is not target or self._spans_routes(old) or self._spans_routes(new):
            msg = (
                f"cross-backend rename is not supported: {old} -> {new} "
                "(source and destination route to different backends)"
            )
            raise WorkspaceError(msg)
        source.rename(old_path, new_path)

    def usage(self) -> tuple[int, int]:
        """(files, bytes) summed over the backends."""
        files = total = 0
        for backend in self._backends:
            count, size = backend.usage()
            files += count
            total += size
        return files, total


def parse_routes(text: str | None) -> dict[str, Path]:
    """Parse `LLM_FILESYSTEM_ROUTES` (`prefix=dir,prefix=dir`) into {route key: dir}.

    Malformed entries (no `=`, blank side, invalid prefix, duplicate key) are skipped with a warning.
    """
    routes: dict[str, Path] = {}
    for raw in (text or "").split(","):
        entry = raw.strip()
        if not entry:
            continue
        prefix, sep, directory = entry.partition("=")
        prefix, directory = prefix.strip(), directory.strip()
        if not sep or not prefix or not directory:
            log.warning("Skipping malformed filesystem route %r (expected prefix=dir)", entry)
            continue
        try:
            key = route_key(prefix)
        except WorkspaceError as exc:
            log.warning("Skipping filesystem route %r: %s", entry, exc)
            continue
        if key in routes:
            log.warning("Skipping duplicate filesystem route %r", entry)
            continue
        routes[key] = Path(directory)
    return routes


# --------------------------------------------------------------------------------------------------
# Owners and the per-owner provider

_OWNER_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def sanitize_owner(owner: str) -> str:
    r"""An owner name as one safe directory name: trim, drop leading `/`/`\`, others → `-`."""
    cleaned = _OWNER_UNSAFE.sub("-", owner.strip().lstrip("/\\"))
    return "default" if not cleaned.strip(".-") else cleaned


def owner_root(workspace_root: Path, category: str, owner: str) -> Path:
    """`{workspace_root}/{category}/{sanitize(owner)}`; category is agents, coordinators or endpoints."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown workspace category {category!r} (expected one of {', '.join(CATEGORIES)})")
    return Path(workspace_root) / category / sanitize_owner(owner)


def resolve_workspace_root(configured: str | None, home: Path | None = None) -> Path:
    """The workspace root: `configured` (`ATMOSPHERE_WORKSPACE_ROOT`) or `~/.atmosphere/workspace`."""
    if configured and configured.strip():
        return Path(configured.strip())
    return (home if home is not None else Path.home()) / ".atmosphere" / "workspace"


def check_conversation_id(conversation_id: str) -> str:
    """A conversation id must be one plain path segment; returns it unchanged."""
    if not isinstance(conversation_id, str) or not conversation_id.strip():
        raise WorkspaceError("conversation id must not be blank")
    illegal = any(ch in conversation_id for ch in "/\\") or ".." in conversation_id
    try:
        valid = validate_path(conversation_id) == conversation_id
    except WorkspaceError:
        valid = False
    if illegal or not valid:
        raise WorkspaceError(f"conversation id contains illegal path characters: {_display(conversation_id)}")
    return conversation_id


class FileSystemProvider:
    """Per-owner file stores: one per conversation, plus routed stores shared by all of them.

    Views are cached (LRU); an evicted view loses nothing (the state lives on disk and in the
    per-root registry). When a new conversation store is about to be created and the owner already
    has `max_conversations`, the least recently modified conversation stores that are not live
    (no view of them exists in this process) are deleted.
    """

    def __init__(
        self,
        owner_root: Path,
        limits: Limits = DEFAULT_LIMITS,
        routes: Mapping[str, Path] | None = None,
        *,
        cache_size: int = 256,
    ) -> None:
        """Bind to `{owner_root}/files/`; `routes` maps prefixes to directories (see `parse_routes`)."""
        self._owner_root = Path(owner_root)
        self._files_dir = self._owner_root / "files"
        self._limits = limits
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, FileSystem] = OrderedDict()
        self._routes: dict[str, FileSystem] = {}
        self._route_roots: set[str] = set()
        # Keys are validated here so a bad route fails at startup, not on the first tool call.
        for key, directory in _keyed_routes(routes or {}).items():
            backend = WorkspaceFileSystem(Path(directory) / "files" / "shared", limits)
            self._route_roots.add(_root_key(backend.root))
            self._routes[key] = backend

    @property
    def owner_root(self) -> Path:
        """The owner's directory."""
        return self._owner_root

    def for_conversation(self, conversation_id: str) -> FileSystem:
        """The filesystem the tools of one conversation see."""
        check_conversation_id(conversation_id)
        with self._lock:
            cached = self._cache.get(conversation_id)
            if cached is not None:
                self._cache.move_to_end(conversation_id)
                return cached
            store = WorkspaceFileSystem(
                self._files_dir / conversation_id,
                self._limits,
                on_create=lambda: self._make_room(conversation_id),
            )
            view: FileSystem = (
                CompositeFileSystem(store, self._routes, max_grep_hits=self._limits.max_grep_hits)
                if self._routes
                else store
            )
            self._cache[conversation_id] = view
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
            return view

    def conversations(self) -> list[str]:
        """Conversation ids with a store on disk, sorted."""
        return sorted(name for name, _ in self._conversation_dirs())

    def _conversation_dirs(self) -> list[tuple[str, float]]:
        try:
            fd = os.open(self._files_dir, _DIR_FLAGS)
        except (FileNotFoundError, NotADirectoryError):
            return []
        found: list[tuple[str, float]] = []
        try:
            with os.scandir(fd) as it:
                names = [entry.name for entry in it]
            for name in names:
                st = _lstat(fd, name)
                if st is None or not stat.S_ISDIR(st.st_mode):
                    continue
                if _root_key(self._files_dir / name) in self._route_roots:
                    continue
                found.append((name, st.st_mtime))
        finally:
            os.close(fd)
        return found

    def _make_room(self, new_conversation: str) -> None:
        """Delete idle conversation stores until a new one fits under `max_conversations`."""
        with self._lock:
            existing = [(mtime, name) for name, mtime in self._conversation_dirs() if name != new_conversation]
            excess = len(existing) - (self._limits.max_conversations - 1)
            if excess <= 0:
                return
            idle = sorted(item for item in existing if _live_state(_root_key(self._files_dir / item[1])) is None)
            for _, name in idle[:excess]:
                log.info("Evicting conversation store %s (owner at %d conversations)", name, len(existing))
                self._remove_conversation_dir(name)
            if len(idle) < excess:
                log.warning(
                    "All conversation stores are live; %s goes over the %d-store cap",
                    new_conversation,
                    self._limits.max_conversations,
                )

    def _remove_conversation_dir(self, name: str) -> bool:
        try:
            fd = os.open(self._files_dir, _DIR_FLAGS)
        except (FileNotFoundError, NotADirectoryError):
            return False
        try:
            st = _lstat(fd, name)
            if st is None:
                return False
            if stat.S_ISDIR(st.st_mode):
                _remove_tree(fd, name)
            else:
                os.unlink(name, dir_fd=fd)
            return True
        except OSError:
            log.warning("Could not delete conversation store %s", name, exc_info=True)
            return False
        finally:
            os.close(fd)

    def drop_conversation(self, conversation_id: str) -> bool:
        """Delete a conversation's whole store (ephemeral sub-agent workspaces); True if one existed."""
        check_conversation_id(conversation_id)
        with self._lock:
            self._cache.pop(conversation_id, None)
        state = _live_state(_root_key(self._files_dir / conversation_id))
        with state.lock if state is not None else contextlib.nullcontext():
            removed = self._remove_conversation_dir(conversation_id)
            if state is not None:
                state.usage = None
        return removed


# --------------------------------------------------------------------------------------------------
# Tool-output offload

_TOOL_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def offload_name(tool_name: str) -> str:
    """`tool-output/{sanitized tool name}-{8 hex}.txt` for an offloaded result."""
    name = _TOOL_NAME_UNSAFE.sub("_", tool_name.strip())[:200] if tool_name and tool_name.strip() else "tool"
    return f"tool-output/{name}-{uuid.uuid4().hex[:8]}.txt"


def offload_preview(result: str, path: str) -> str:
    """What the model sees instead of an offloaded result: its head and a pointer to the file."""
    hidden = len(result) - OFFLOAD_PREVIEW_CHARS
    return (
        f"{result[:OFFLOAD_PREVIEW_CHARS]}\n\n"
        f"[... {hidden} chars truncated. Full output saved to {path} — use read_file to read it.]"
    )


def maybe_offload(
    fs: FileSystem | None, tool_name: str, result: str, threshold: int = DEFAULT_OFFLOAD_THRESHOLD
) -> str:
    """Offload an over-threshold result to `fs` and return the preview; never loses data or raises.

    A disabled threshold (`<= 0`), a short result, no filesystem, or a failed write all return the
    result unchanged.
    """
    if fs is None or threshold <= 0 or len(result) <= threshold:
        return result
    path = offload_name(tool_name)
    try:
        fs.write(path, result)
    except (WorkspaceError, OSError) as exc:
        log.debug("Tool-output offload failed for %s: %s", tool_name, exc)
        return result
    return offload_preview(result, path)
