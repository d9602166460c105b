"""The contract between the file tools and whatever stores their files.

`FileSystem` is what `run_file_tool` programs against; a single bounded store
(`filestore.WorkspaceFileSystem`) and a prefix-routed composite of stores
(`composite.CompositeFileSystem`) both satisfy it. It lives in its own module, below every
implementation, so that path validation, the store and the composite can all raise
`WorkspaceError` and speak `Entry`/`Hit` without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class WorkspaceError(Exception):
    """A rejected file operation; `str(error)` is what the model sees after `Error: `."""


class MissingFileError(WorkspaceError):
    """The file named does not exist (the admin read answers it as not found, not as malformed)."""


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


__all__ = ["Entry", "FileSystem", "Hit", "WorkspaceError"]
