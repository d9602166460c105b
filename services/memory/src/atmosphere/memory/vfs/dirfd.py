"""Directory-fd primitives: open, stat, read, write, walk and remove without ever following a link.

The second line of the workspace's security model. Every helper here takes a directory fd and at
most one plain name beneath it, never a path: the store root is opened as a directory fd and each
component is opened beneath its parent's fd with `O_NOFOLLOW`. There is no realpath-then-open step
for an attacker to race (the `filepath-securejoin` TOCTOU class). A link anywhere on the way is
refused; so are FIFOs, devices and hard-linked files (see `check_regular`).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from atmosphere.memory.vfs.filesystem import WorkspaceError
from atmosphere.memory.vfs.paths import MAX_PATH_DEPTH

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
"""Open a directory beneath a fd, refusing a link."""
# O_NONBLOCK: opening a FIFO for reading must not wait for a writer (it is refused right after).
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
"""Open a file for reading beneath a fd, refusing a link."""
TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
"""Create a fresh temp file beneath a fd (never an existing entry, never through a link)."""


@dataclass(slots=True)
class Usage:
    """What a tree holds (or what a removal took away): regular files, their bytes, directories."""

    files: int = 0
    bytes: int = 0
    dirs: int = 0


@dataclass(frozen=True, slots=True)
class Node:
    """One entry met by `walk_tree`: its path relative to the walk's start."""

    path: str
    st: os.stat_result
    directory: bool


def link_error(display: str) -> WorkspaceError:
    """The error for a link met on the way (or an entry swapped under us, which only a link swap does)."""
    return WorkspaceError(f"Path escapes the store root via a link: {display}")


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    """`name`'s own stat beneath `dir_fd` (a link is not followed); None when missing."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def is_link_at(dir_fd: int, name: str) -> bool:
    """Whether `name` beneath `dir_fd` is itself a symbolic link (False when it cannot be read)."""
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def check_regular(st: os.stat_result, display: str) -> None:
    """Refuse anything but a plain, singly-linked regular file.

    Hard links are refused because a hard link is indistinguishable by path from a regular file and
    may share its inode with a file outside the store; our own writes (temp file + rename) always
    produce `st_nlink == 1`, so `> 1` means something outside the tools planted it.
    """
    if stat.S_ISLNK(st.st_mode):
        raise link_error(display)
    if stat.S_ISDIR(st.st_mode):
        raise WorkspaceError(f"Is a directory: {display}")
    if not stat.S_ISREG(st.st_mode):
        raise WorkspaceError(f"Not a regular file: {display}")
    if st.st_nlink > 1:
        raise link_error(display)


def read_all(fd: int, limit: int) -> bytes:
    """Up to `limit` bytes from `fd` (ask for one more than allowed to detect an over-size file)."""
    chunks: list[bytes] = []
    total = 0
    while total < limit:
        chunk = os.read(fd, min(1 << 20, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def write_all(fd: int, data: bytes) -> None:
    """Write all of `data` (`os.write` may write less than asked)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def replace_atomically(dir_fd: int, name: str, data: bytes, *, temp: str, mode: int, sync_dir: bool = False) -> None:
    """Put `data` at `name` beneath `dir_fd`: write temp file `temp` in the same directory, fsync, rename.

    A reader sees the old file or the new one, never a torn one. rename(2) replaces the destination
    entry itself: a link planted there is never followed. `sync_dir` also makes the rename durable.
    """
    fd = os.open(temp, TEMP_FLAGS, mode, dir_fd=dir_fd)
    try:
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        if sync_dir:
            os.fsync(dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):  # keep the original error, not a failed cleanup's
            os.unlink(temp, dir_fd=dir_fd)
        raise


def remove_tree(parent_fd: int, name: str) -> Usage:
    """Delete directory `name` under `parent_fd`, children first, never following a link.

    Returns what was removed (regular files, their bytes, directories including this one).
    """
    removed = Usage()
    fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    try:
        with os.scandir(fd) as entries:
            children = list(entries)
        for child in children:
            st = lstat_at(fd, child.name)
            if st is None:
                continue
            if stat.S_ISDIR(st.st_mode):
                sub = remove_tree(fd, child.name)
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


def walk_tree(dir_fd: int, prefix: str, depth: int) -> Iterator[Node]:
    """Every directory and regular file under `dir_fd`, depth-first in name order; links skipped."""
    with os.scandir(dir_fd) as entries:
        names = sorted(entry.name for entry in entries)
    for name in names:
        st = lstat_at(dir_fd, name)
        if st is None:
            continue
        path = f"{prefix}/{name}" if prefix else name
        if stat.S_ISREG(st.st_mode):
            yield Node(path, st, directory=False)
        elif stat.S_ISDIR(st.st_mode):
            yield Node(path, st, directory=True)
            if depth + 1 >= MAX_PATH_DEPTH:
                continue
            try:
                child = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
            except OSError:
                continue  # vanished, or swapped for a link since the lstat: skip it
            try:
                yield from walk_tree(child, path, depth + 1)
            finally:
                os.close(child)


__all__ = [
    "DIR_FLAGS",
    "READ_FLAGS",
    "TEMP_FLAGS",
    "Node",
    "Usage",
    "check_regular",
    "link_error",
    "lstat_at",
    "read_all",
    "remove_tree",
    "replace_atomically",
    "walk_tree",
    "write_all",
]
