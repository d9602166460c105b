"""Changing one file store: write, edit, delete and rename, under the store's lock and within its bounds.

Writes go to a temp file in the target's directory fd and are `rename`d into place, so a planted
link at the destination is replaced, never written through; every mutation holds the lock of the
store root, shared by every instance for that root in this process, with the file/byte/directory
accounting that enforces the bounds.
"""

from __future__ import annotations

import os
import stat
import uuid

from atmosphere.memory.vfs.dirfd import (
    DIR_FLAGS,
    Usage,
    check_regular,
    link_error,
    lstat_at,
    remove_tree,
    replace_atomically,
    walk_tree,
)
from atmosphere.memory.vfs.filereads import FileReads
from atmosphere.memory.vfs.filesystem import MissingFileError, WorkspaceError
from atmosphere.memory.vfs.limits import Limits
from atmosphere.memory.vfs.paths import MAX_PATH_BYTES, MAX_PATH_DEPTH, validate_path
from atmosphere.memory.vfs.storeroot import StoreRoot


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


class FileWrites:
    """The mutations of one store, each under the store root's lock."""

    def __init__(self, tree: StoreRoot, limits: Limits, *, reads: FileReads) -> None:
        """Change the files under `tree` within `limits`; `reads` reads a file's text (for `edit`)."""
        self._tree = tree
        self._limits = limits
        self._reads = reads

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
            content = self._reads.read(norm)
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
