"""One bounded, traversal-proof store of files: what a conversation's file tools read and write.

Layout: `{workspace_root}/{agents|coordinators|endpoints}/{owner}/files/{conversation_id}/` holds one
conversation's files; a routed prefix (`LLM_FILESYSTEM_ROUTES`) lives at `{dir}/files/shared/` and is
shared by every conversation. This module is one such store and its bounds; `conversation_stores` decides
which store a conversation sees, and `composite` puts a conversation's store and the routed ones behind one
namespace.

Security model, in the order a model-supplied path meets it:

1. `paths.validate_path` rejects everything that is not a plain relative path, before any I/O.
2. Resolution is fd-relative and never follows a link (`storeroot`, `dirfd`): every component is
   opened beneath its parent's fd with `O_NOFOLLOW`, so there is no check-then-use window to race.
3. Writes go to a temp file in the target's directory fd and are `rename`d into place, so a planted
   link at the destination is replaced, never written through.
4. Every mutation runs under one lock per store root, shared by every `WorkspaceFileSystem` instance
   for that root in this process, with the file/byte/directory accounting that enforces the bounds.
"""

from __future__ import annotations

import os
import stat
import time
import unicodedata
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from atmosphere.memory.vfs.dirfd import (
    DIR_FLAGS,
    Usage,
    check_regular,
    link_error,
    lstat_at,
    read_all,
    remove_tree,
    replace_atomically,
    walk_tree,
)
from atmosphere.memory.vfs.filesystem import Entry, Hit, MissingFileError, WorkspaceError
from atmosphere.memory.vfs.paths import MAX_PATH_BYTES, MAX_PATH_DEPTH, addressable, validate_path
from atmosphere.memory.vfs.patterns import compile_glob, compile_regex, timeout_error
from atmosphere.memory.vfs.storeroot import StoreRoot, classify_open_error

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds of one store (one conversation, or one routed backend)."""

    max_file_bytes: int = 512 * KIB
    max_files: int = 256
    max_total_bytes: int = 16 * MIB
    max_conversations: int = 256
    """Conversation stores per user of an owner; that user's least recently modified idle ones go past it."""
    max_grep_hits: int = 500
    grep_line_chars: int = 500
    max_pattern_chars: int = 512
    grep_deadline: float = 2.0
    """Seconds one grep (or glob) may spend matching, across all files."""
    max_dirs: int = 1024
    """Directories per store, so write-then-delete cannot pile up empty directories forever."""


DEFAULT_LIMITS = Limits()


# --------------------------------------------------------------------------------------------------
# Text helpers


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
        self._tree = StoreRoot(root, max_dirs=limits.max_dirs, on_create=on_create)
        self._limits = limits

    @property
    def root(self) -> Path:
        """The store root."""
        return Path(self._tree.key)

    @property
    def limits(self) -> Limits:
        """The store's bounds."""
        return self._limits

    def usage(self) -> tuple[int, int]:
        """(files, bytes) held by the store."""
        with self._tree.lock:
            usage = self._tree.usage_locked()
            return usage.files, usage.bytes

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
        root_fd = self._tree.open_root(create=False)
        if root_fd is None:
            return []
        try:
            fd = self._tree.walk_dirs(root_fd, segments, prefix, create=False)
        finally:
            os.close(root_fd)
        if fd is None:
            return []
        entries: list[Entry] = []
        try:
            with os.scandir(fd) as it:
                names = [entry.name for entry in it]
            for name in names:
                st = lstat_at(fd, name)
                if st is None or not addressable(name):
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
        opened = self._tree.open_file(norm)
        if opened is None:
            raise MissingFileError(f"File not found: {norm}")
        fd, st = opened
        limit = self._limits.max_file_bytes
        try:
            if st.st_size > limit:
                raise WorkspaceError(f"File too large to read: {norm} is {st.st_size} bytes (limit {limit})")
            data = read_all(fd, limit + 1)
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
            root_fd = self._tree.open_root(create=False)
            return [] if root_fd is None else self._files_in(root_fd, "", 0)
        parent = self._tree.open_parent(segments, display)
        if parent is None:
            return []
        try:
            st = lstat_at(parent, segments[-1])
            if st is None:
                return []
            if stat.S_ISLNK(st.st_mode):
                raise link_error(display)
            if stat.S_ISREG(st.st_mode):
                return [display]
            if not stat.S_ISDIR(st.st_mode):
                return []
            try:
                fd = os.open(segments[-1], DIR_FLAGS, dir_fd=parent)
            except OSError as exc:
                raise classify_open_error(parent, segments[-1], display, display, exc) from None
        finally:
            os.close(parent)
        return self._files_in(fd, display, len(segments))

    @staticmethod
    def _files_in(fd: int, prefix: str, depth: int) -> list[str]:
        """Regular files under directory `fd` (which is closed), sorted by path."""
        try:
            return sorted(node.path for node in walk_tree(fd, prefix, depth) if not node.directory)
        finally:
            os.close(fd)

    def glob(self, pattern: str) -> list[str]:
        """Files whose relative path matches `pattern`, sorted (see `patterns.glob_regex` for the syntax)."""
        if not isinstance(pattern, str) or not pattern.strip():
            raise WorkspaceError("pattern must not be blank")
        pattern = unicodedata.normalize("NFKC", pattern)
        self._check_pattern_length(pattern)
        matcher = compile_glob(pattern)
        deadline = time.monotonic() + self._limits.grep_deadline
        matches: list[str] = []
        try:
            for path in self._files_under([], ""):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                if addressable(path) and matcher.fullmatch(path, timeout=remaining) is not None:
                    matches.append(path)
        except TimeoutError:
            raise timeout_error("glob", pattern, self._limits.grep_deadline) from None
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
        matcher = compile_regex(pattern)
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
            raise timeout_error("grep", pattern, self._limits.grep_deadline) from None
        return hits

    def _grep_lines(self, path: str) -> list[str]:
        """A file's lines, or nothing for files grep skips (links, special, over-size, binary)."""
        limit = self._limits.max_file_bytes
        try:
            opened = self._tree.open_file(path) if addressable(path) else None
        except WorkspaceError:
            opened = None
        if opened is None:
            return []
        fd, st = opened
        try:
            data = read_all(fd, limit + 1) if st.st_size <= limit else b""
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
        with self._tree.lock:
            self._write_locked(norm, data)

    def _write_locked(self, norm: str, data: bytes) -> None:
        limits = self._limits
        if len(data) > limits.max_file_bytes:
            size, limit = len(data), limits.max_file_bytes
            msg = f"Write rejected: {norm} would be {size} bytes, over the {limit}-byte per-file limit"
            raise WorkspaceError(msg)
        usage = self._tree.usage_locked()
        segments = norm.split("/")
        parent = self._tree.open_parent(segments, norm)
        try:
            existing: int | None = None
            if parent is not None:
                st = lstat_at(parent, segments[-1])
                if st is not None:
                    check_regular(st, norm)
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
                parent = self._tree.open_parent(segments, norm, create=True)
                if parent is None:  # pragma: no cover - create=True never answers None
                    raise MissingFileError(f"File not found: {norm}")
            replace_atomically(parent, segments[-1], data, temp=f".atmo-{uuid.uuid4().hex}.tmp", mode=0o644)
        finally:
            if parent is not None:
                os.close(parent)
        usage.bytes = projected
        if existing is None:
            usage.files += 1
        self._tree.touch()

    def edit(self, path: str, old_text: str, new_text: str) -> None:
        """Replace the one occurrence of `old_text` (overlaps count as occurrences) with `new_text`."""
        norm = validate_path(path)
        if not old_text:
            raise WorkspaceError("oldText must not be empty")
        with self._tree.lock:
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

    def _open_existing(self, segments: list[str], norm: str) -> tuple[int, os.stat_result]:
        """The parent fd (the caller closes it) and own stat of an existing entry that is not a link."""
        parent = self._tree.open_parent(segments, norm)
        if parent is None:
            raise WorkspaceError(f"Not found: {norm}")
        try:
            st = lstat_at(parent, segments[-1])
            if st is None:
                raise WorkspaceError(f"Not found: {norm}")
            if stat.S_ISLNK(st.st_mode):
                raise link_error(norm)
        except BaseException:
            os.close(parent)
            raise
        return parent, st

    def delete(self, path: str) -> None:
        """Remove a file, or a whole directory tree (children first). No bounds apply."""
        norm = validate_path(path)
        segments = norm.split("/")
        with self._tree.lock:
            usage = self._tree.usage_locked()
            parent, st = self._open_existing(segments, norm)
            try:
                if stat.S_ISDIR(st.st_mode):
                    removed = remove_tree(parent, segments[-1])
                else:
                    os.unlink(segments[-1], dir_fd=parent)
                    regular = stat.S_ISREG(st.st_mode)
                    removed = Usage(files=int(regular), bytes=st.st_size if regular else 0)
            finally:
                os.close(parent)
            usage.files -= removed.files
            usage.bytes -= removed.bytes
            usage.dirs -= removed.dirs
            self._tree.touch()

    def rename(self, old_path: str, new_path: str) -> None:
        """Move a file or directory; destination parents are created, an existing destination refused."""
        old = validate_path(old_path)
        new = validate_path(new_path)
        old_segments, new_segments = old.split("/"), new.split("/")
        with self._tree.lock:
            self._tree.usage_locked()
            src_parent, st = self._open_existing(old_segments, old)
            try:
                is_dir = stat.S_ISDIR(st.st_mode)
                if is_dir and (new == old or new.startswith(old + "/")):
                    raise WorkspaceError(f"Cannot move {old} into itself ({new})")
                if is_dir:
                    self._check_moved_tree(src_parent, old_segments[-1], new)
                self._rename_into(src_parent, old_segments[-1], new_segments, new)
            finally:
                os.close(src_parent)
            self._tree.touch()

    def _rename_into(self, src_parent: int, name: str, new_segments: list[str], new: str) -> None:
        exists_msg = f"Destination already exists: {new} — delete it first if you want to replace it"
        dst_parent = self._tree.open_parent(new_segments, new)
        try:
            if dst_parent is not None and lstat_at(dst_parent, new_segments[-1]) is not None:
                raise WorkspaceError(exists_msg)
            if dst_parent is None:
                dst_parent = self._tree.open_parent(new_segments, new, create=True)
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
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
        try:
            for node in walk_tree(fd, "", 0):
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
        with self._tree.lock:
            self._tree.forget_usage()


__all__ = ["DEFAULT_LIMITS", "KIB", "MIB", "Limits", "WorkspaceFileSystem"]
