"""One store's root directory: resolving validated paths beneath it, and its shared lock and accounting.

`StoreRoot` turns an already validated relative path into directory fds one component at a time
(`dirfd`), never following a link, creating missing directories on request. It also owns the
per-root state that every `WorkspaceFileSystem` instance for the same root shares in this process:
one lock for all mutations and the file/byte/directory accounting that enforces the bounds. The
state is held weakly, so `live_state` tells `ConversationStores` which stores are in use (and must not be
evicted).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

from atmosphere.memory.vfs.dirfd import (
    DIR_FLAGS,
    READ_FLAGS,
    Usage,
    check_regular,
    link_error,
    lstat_at,
    walk_tree,
)
from atmosphere.memory.vfs.filesystem import WorkspaceError


class _StoreState:
    """The lock and accounting that every instance for one root shares (held weakly by the registry)."""

    __slots__ = ("__weakref__", "lock", "usage")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.usage: Usage | None = None


_states: weakref.WeakValueDictionary[str, _StoreState] = weakref.WeakValueDictionary()
_states_lock = threading.Lock()


def root_key(root: Path | str) -> str:
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


def live_state(key: str) -> _StoreState | None:
    """The shared state of a root that a live store instance holds; None when none is alive."""
    with _states_lock:
        return _states.get(key)


def classify_open_error(parent_fd: int, name: str, rel: str, display: str, exc: OSError) -> Exception:
    """Map a failed directory open to the model-facing error."""
    if exc.errno not in {errno.ENOTDIR, errno.ELOOP}:
        return exc
    st = lstat_at(parent_fd, name)
    if st is None or stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode):
        # A link, or an entry that changed under us (only a link swap does that): fail closed.
        return link_error(display)
    return WorkspaceError(f"Not a directory: {rel}")


class StoreRoot:
    """The root directory of one store, its shared lock and accounting, and fd-relative resolution.

    Every method that creates a directory, and `usage_locked`, expects the caller to hold `lock`.
    """

    def __init__(self, root: Path | str, *, max_dirs: int, on_create: Callable[[], None] | None = None) -> None:
        """Bind to `root`; `max_dirs` bounds created directories, `on_create` runs before the root is made."""
        self.key = root_key(root)
        self._max_dirs = max_dirs
        self._on_create = on_create
        self._state = _state_for(self.key)

    @property
    def lock(self) -> threading.Lock:
        """The lock every mutation of this root takes (shared by all instances for the root)."""
        return self._state.lock

    # ---- accounting

    def usage_locked(self) -> Usage:
        """The store's accounting, computed by one walk the first time (caller holds the lock)."""
        if self._state.usage is None:
            usage = Usage()
            root_fd = self.open_root(create=False)
            if root_fd is not None:
                try:
                    for node in walk_tree(root_fd, "", 0):
                        if node.directory:
                            usage.dirs += 1
                        else:
                            usage.files += 1
                            usage.bytes += node.st.st_size
                finally:
                    os.close(root_fd)
            self._state.usage = usage
        return self._state.usage

    def forget_usage(self) -> None:
        """Drop the cached accounting; the next `usage_locked` walks the tree again (caller holds the lock)."""
        self._state.usage = None

    def touch(self) -> None:
        """Bump the root's mtime: `ConversationStores` evicts the least recently modified conversation."""
        with contextlib.suppress(OSError):
            os.utime(self.key, follow_symlinks=False)

    # ---- resolution

    def open_root(self, *, create: bool) -> int | None:
        """The root's directory fd (None when missing and not created)."""
        try:
            return os.open(self.key, DIR_FLAGS)
        except FileNotFoundError:
            if not create:
                return None
        except OSError as exc:
            if exc.errno in {errno.ENOTDIR, errno.ELOOP}:  # a file or a link where the root should be
                raise WorkspaceError("the store root is not a plain directory") from None
            raise
        if self._on_create is not None:
            self._on_create()
        os.makedirs(self.key, exist_ok=True)
        return os.open(self.key, DIR_FLAGS)

    def _open_child_dir(self, parent_fd: int, name: str, rel: str, display: str, *, create: bool) -> int | None:
        try:
            return os.open(name, DIR_FLAGS, dir_fd=parent_fd)
        except FileNotFoundError:
            if not create:
                return None
        except OSError as exc:
            raise classify_open_error(parent_fd, name, rel, display, exc) from None
        self._make_dir(parent_fd, name)
        try:
            return os.open(name, DIR_FLAGS, dir_fd=parent_fd)
        except OSError as exc:
            raise classify_open_error(parent_fd, name, rel, display, exc) from None

    def _make_dir(self, parent_fd: int, name: str) -> None:
        usage = self.usage_locked()
        if usage.dirs >= self._max_dirs:
            msg = (
                f"Write rejected: the store already holds {usage.dirs} directories, "
                f"at the {self._max_dirs}-directory limit"
            )
            raise WorkspaceError(msg)
        try:
            os.mkdir(name, 0o755, dir_fd=parent_fd)
        except FileExistsError:
            return
        usage.dirs += 1

    def walk_dirs(self, root_fd: int, segments: list[str], display: str, *, create: bool) -> int | None:
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

    def open_parent(self, segments: list[str], display: str, *, create: bool = False) -> int | None:
        """The directory fd holding the last segment (None when the root or a parent is missing)."""
        root_fd = self.open_root(create=create)
        if root_fd is None:
            return None
        try:
            return self.walk_dirs(root_fd, segments[:-1], display, create=create)
        finally:
            os.close(root_fd)

    def open_file(self, norm: str) -> tuple[int, os.stat_result] | None:
        """Open a regular file for reading (None when missing)."""
        segments = norm.split("/")
        parent = self.open_parent(segments, norm)
        if parent is None:
            return None
        try:
            name = segments[-1]
            before = lstat_at(parent, name)
            if before is None:
                return None
            check_regular(before, norm)  # refuse devices/FIFOs before opening them at all
            try:
                fd = os.open(name, READ_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise link_error(norm) from None
                raise
            try:
                st = os.fstat(fd)
                check_regular(st, norm)  # the entry may have been swapped since the lstat
            except BaseException:
                os.close(fd)
                raise
            return fd, st
        finally:
            os.close(parent)


__all__ = ["StoreRoot", "classify_open_error", "live_state", "root_key"]
