"""Which file store a conversation's tools see: one per conversation of an owner, plus shared routes.

Layout: `{owner_root}/files/{conversation_id}/` per conversation; each route of
`LLM_FILESYSTEM_ROUTES` is a store at `{dir}/files/shared/`, shared by every conversation and
mounted through a `CompositeFileSystem`. `ConversationStores` also bounds how many conversation stores
each user keeps under an owner: past `max_conversations`, that user's least recently modified idle ones
are deleted (bounded, never bricked: a new conversation always gets a store; and per user, so one
user's conversations never evict another's).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from pathlib import Path

from atmosphere.memory.vfs.composite import CompositeFileSystem
from atmosphere.memory.vfs.dirfd import DIR_FLAGS, lstat_at, remove_tree
from atmosphere.memory.vfs.filestore import DEFAULT_LIMITS, Limits, WorkspaceFileSystem
from atmosphere.memory.vfs.filesystem import FileSystem
from atmosphere.memory.vfs.paths import check_conversation_id, keyed_routes
from atmosphere.memory.vfs.storeroot import live_state, root_key
from atmosphere.service import conversation_user_key

# The workspace modules share one logger name, the one operators already filter on.
log = logging.getLogger("atmosphere.memory.workspace")


class ConversationStores:
    """One owner's file stores: one per conversation, plus routed stores shared by all of them.

    Views are cached (LRU); an evicted view loses nothing (the state lives on disk and in the
    per-root registry). When a new conversation store is about to be created and its user already
    has `max_conversations` under this owner, that user's least recently modified conversation
    stores that are not live (no view of them exists in this process) are deleted.
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
        for key, directory in keyed_routes(routes or {}).items():
            backend = WorkspaceFileSystem(Path(directory) / "files" / "shared", limits)
            self._route_roots.add(root_key(backend.root))
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

    @contextlib.contextmanager
    def _open_files_dir(self) -> Iterator[int | None]:
        """The `files/` directory fd, closed on exit; None when there is none yet."""
        try:
            fd = os.open(self._files_dir, DIR_FLAGS)
        except (FileNotFoundError, NotADirectoryError):
            yield None
            return
        try:
            yield fd
        finally:
            os.close(fd)

    def _conversation_dirs(self) -> list[tuple[str, float]]:
        found: list[tuple[str, float]] = []
        with self._open_files_dir() as fd:
            if fd is None:
                return []
            with os.scandir(fd) as it:
                names = [entry.name for entry in it]
            for name in names:
                st = lstat_at(fd, name)
                if st is None or not stat.S_ISDIR(st.st_mode):
                    continue
                if root_key(self._files_dir / name) in self._route_roots:
                    continue
                found.append((name, st.st_mtime))
        return found

    def _make_room(self, new_conversation: str) -> None:
        """Delete idle conversation stores of the same user until a new one fits under `max_conversations`.

        The cap is per user (`conversation_user_key`): one user's new conversations only ever
        evict that user's own idle ones, never another user's files.
        """
        user = conversation_user_key(new_conversation)
        with self._lock:
            existing = [
                (mtime, name)
                for name, mtime in self._conversation_dirs()
                if name != new_conversation and conversation_user_key(name) == user
            ]
            excess = len(existing) - (self._limits.max_conversations - 1)
            if excess <= 0:
                return
            idle = sorted(item for item in existing if live_state(root_key(self._files_dir / item[1])) is None)
            for _, name in idle[:excess]:
                log.info("Evicting conversation store %s (its user at %d conversations)", name, len(existing))
                self._remove_conversation_dir(name)
            if len(idle) < excess:
                log.warning(
                    "All conversation stores are live; %s goes over the %d-store cap",
                    new_conversation,
                    self._limits.max_conversations,
                )

    def _remove_conversation_dir(self, name: str) -> bool:
        with self._open_files_dir() as fd:
            if fd is None:
                return False
            try:
                st = lstat_at(fd, name)
                if st is None:
                    return False
                if stat.S_ISDIR(st.st_mode):
                    remove_tree(fd, name)
                else:
                    os.unlink(name, dir_fd=fd)
                return True
            except OSError:
                log.warning("Could not delete conversation store %s", name, exc_info=True)
                return False

    def drop_conversation(self, conversation_id: str) -> bool:
        """Delete a conversation's whole store (ephemeral sub-agent workspaces); True if one existed."""
        check_conversation_id(conversation_id)
        with self._lock:
            self._cache.pop(conversation_id, None)
        state = live_state(root_key(self._files_dir / conversation_id))
        with state.lock if state is not None else contextlib.nullcontext():
            removed = self._remove_conversation_dir(conversation_id)
            if state is not None:
                state.usage = None
        return removed


__all__ = ["ConversationStores"]
