"""One bounded, traversal-proof store of files: what a conversation's file tools read and write.

Layout: `{workspace_root}/{agents|coordinators|endpoints}/{owner}/files/{conversation_id}/` holds one
conversation's files; a routed prefix (`LLM_FILESYSTEM_ROUTES`) lives at `{dir}/files/shared/` and is
shared by every conversation. This module is one such store: its reads in `filereads`, its search in
`filesearch`, its mutations in `filewrites`, its bounds in `limits`; `conversation_stores` decides which store a
conversation sees, and `composite` puts a conversation's store and the routed ones behind one namespace.

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

from collections.abc import Callable
from pathlib import Path

from atmosphere.memory.vfs.filereads import FileReads
from atmosphere.memory.vfs.filesearch import FileSearch
from atmosphere.memory.vfs.filesystem import Entry, Hit
from atmosphere.memory.vfs.filewrites import FileWrites
from atmosphere.memory.vfs.limits import DEFAULT_LIMITS, KIB, MIB, Limits
from atmosphere.memory.vfs.storeroot import StoreRoot


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
        self._reads = FileReads(self._tree, max_file_bytes=limits.max_file_bytes)
        self._search = FileSearch(self._tree, limits)
        # No reference back to this store: a view dropped from a cache is gone at once, and a
        # store with no view is not live (`conversation_stores` evicts only those).
        self._writes = FileWrites(self._tree, limits, reads=self._reads)

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
        return self._reads.ls(directory)

    def read(self, path: str) -> str:
        """A file's full UTF-8 content."""
        return self._reads.read(path)

    def glob(self, pattern: str) -> list[str]:
        """Files whose relative path matches `pattern`, sorted (see `patterns.glob_regex` for the syntax)."""
        return self._search.glob(pattern)

    def grep(self, pattern: str, directory: str | None = None) -> list[Hit]:
        """Lines matching the regex `pattern` (see `FileSearch.grep` for the bounds)."""
        return self._search.grep(pattern, directory)

    # ---- mutations

    def write(self, path: str, content: str) -> None:
        """Create or replace a file (parents created), within the store's bounds."""
        self._writes.write(path, content)

    def edit(self, path: str, old_text: str, new_text: str) -> None:
        """Replace the one occurrence of `old_text` (overlaps count as occurrences) with `new_text`."""
        self._writes.edit(path, old_text, new_text)

    def delete(self, path: str) -> None:
        """Remove a file, or a whole directory tree (children first). No bounds apply."""
        self._writes.delete(path)

    def rename(self, old_path: str, new_path: str) -> None:
        """Move a file or directory; destination parents are created, an existing destination refused."""
        self._writes.rename(old_path, new_path)

    def reset(self) -> None:
        """Forget the cached accounting (after the tree was changed behind the store's back)."""
        with self._tree.lock:
            self._tree.forget_usage()


__all__ = ["DEFAULT_LIMITS", "KIB", "MIB", "Limits", "WorkspaceFileSystem"]
