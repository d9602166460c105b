"""Reading one file store: a directory's entries and a file's text, lock-free and never through a link.

Writes are atomic renames, so a reader sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import os
import stat

from atmosphere.memory.vfs.dirfd import lstat_at, read_all
from atmosphere.memory.vfs.filesystem import Entry, MissingFileError, WorkspaceError
from atmosphere.memory.vfs.paths import addressable, validate_path
from atmosphere.memory.vfs.storeroot import StoreRoot


class FileReads:
    """`ls` and `read` of one store."""

    def __init__(self, tree: StoreRoot, *, max_file_bytes: int) -> None:
        """Read under `tree`; a file over `max_file_bytes` is refused."""
        self._tree = tree
        self._max_file_bytes = max_file_bytes

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
        limit = self._max_file_bytes
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
