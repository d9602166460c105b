"""A session's directory on the host, and the host's only ways of touching what the code put there.

Layout: `<root>/<session>/workspace` (mode 0700, owned by the sandbox user, bound at `/workspace`;
a tmpfs of its own where the service may mount one, so that the code cannot learn the host path:
`tmpfs`). `<root>` and `<root>/<session>` belong to the service (mode 0711: the sandbox user may
pass through, to reach its own workspace, but not list them); `<session>` is
`<label>-<service pid>-<id>`.

The code controls everything inside the workspace, so the host never follows a name there: it
works from directory descriptors, opens with `O_NOFOLLOW`, checks what it opened with `fstat`,
and never descends into a symbolic link (the Judge0 CVE-2024-28185/28189 class: a host that
followed a planted symlink while collecting, chowning or removing wrote where the code chose).
Removal and the size check hold a bounded number of descriptors whatever the depth of the tree.

The size of a workspace is not a filesystem quota (an unprivileged host has no bounded filesystem
to give each session, and a tmpfs is twice the budget): `measure` adds up the blocks of its files,
while code runs and after, and the sandbox stops code and empties the workspace past
`workspace_bytes`. A tree too deep
(`MAX_DEPTH`) or with too many entries (`MAX_ENTRIES`) counts as over the budget.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from atmosphere.sandbox.code import tmpfs

MAX_DEPTH: Final = 64
"""Directory levels a workspace may nest (more: over its budget)."""
MAX_ENTRIES: Final = 100_000
"""Files and directories a workspace may hold (more: over its budget)."""
ARTIFACTS: Final = "artifacts"

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SESSION_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


class WorkspaceError(OSError):
    """The workspace changed under the host in a way it refuses to follow."""


@dataclass(frozen=True, slots=True)
class Usage:
    """How much a workspace holds."""

    bytes: int
    entries: int
    complete: bool
    """False when the walk stopped early: too deep or too many entries (counts as over any budget)."""

    def over(self, budget: int) -> bool:
        """More than `budget` bytes, or too large a tree to count."""
        return not self.complete or self.bytes > budget


def unreachable(path: Path, uid: int, gid: int) -> str | None:
    """Why user `uid` (group `gid`) cannot pass through every directory above `path` (None: it can).

    bwrap, running as the sandbox user, finds the workspace by its path.
    """
    for directory in path.resolve().parents:
        info = directory.stat()
        if info.st_mode & stat.S_IXOTH:
            continue
        if info.st_uid == uid and info.st_mode & stat.S_IXUSR:
            continue
        if info.st_gid == gid and info.st_mode & stat.S_IXGRP:
            continue
        return f"{directory} (mode {stat.S_IMODE(info.st_mode):04o}) does not let uid {uid} pass"
    return None


class SessionDirectory:
    """`<root>/<session>/workspace`, made for one session and removed at its end."""

    def __init__(
        self, root: Path, session_id: str, *, owner: tuple[int, int] | None, tmpfs_bytes: int | None = None
    ) -> None:
        """A new directory for `session_id` under `root`; the workspace is chowned to `owner` (uid, gid).

        With `tmpfs_bytes`, the workspace is a tmpfs of that size (`tmpfs.mount`).

        Raises:
            OSError: it could not be made (nothing is left of it then).
        """
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o711)  # noqa: S103 - passable (bwrap, as the sandbox user, opens by path), not listable
        label = _SESSION_NAME.sub("_", session_id)[:40]
        self.path = root / f"{label}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.owner = owner
        self.path.mkdir(mode=0o711)
        os.chmod(self.path, 0o711)  # noqa: S103 - as the root; mkdir's mode is masked by the umask
        self.workspace = self.path / "workspace"
        self.mounted = False
        try:
            self.workspace.mkdir(mode=0o700)
            if tmpfs_bytes is not None:
                tmpfs.mount(self.workspace, tmpfs_bytes, owner)
                self.mounted = True
            if owner is not None:
                os.chown(self.workspace, *owner)
            with self.open_workspace() as fd:
                self.reset_artifacts(fd)
        except OSError:
            self.remove()
            raise

    @contextlib.contextmanager
    def open_workspace(self) -> Iterator[int]:
        """A descriptor of the workspace directory (closed on exit)."""
        fd = os.open(self.workspace, _DIR_FLAGS)
        try:
            yield fd
        finally:
            os.close(fd)

    def reset_artifacts(self, workspace_fd: int) -> None:
        """An empty `artifacts` directory again (whatever the code left under that name goes)."""
        with contextlib.suppress(FileNotFoundError):
            info = os.stat(ARTIFACTS, dir_fd=workspace_fd, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                fd = os.open(ARTIFACTS, _DIR_FLAGS, dir_fd=workspace_fd)
                try:
                    clear(fd)
                finally:
                    os.close(fd)
                return
            os.unlink(ARTIFACTS, dir_fd=workspace_fd)
        os.mkdir(ARTIFACTS, 0o755, dir_fd=workspace_fd)
        if self.owner is not None:
            os.chown(ARTIFACTS, *self.owner, dir_fd=workspace_fd, follow_symlinks=False)

    def wipe(self) -> None:
        """Empty the workspace (its budget was exceeded); `artifacts` is made again."""
        with self.open_workspace() as fd:
            clear(fd)
            self.reset_artifacts(fd)

    def measure(self) -> Usage:
        """What the workspace holds now (safe while code runs: nothing is followed)."""
        with self.open_workspace() as fd:
            counter = _Counter()
            complete = counter.walk(fd, 0)
            return Usage(counter.bytes, counter.entries, complete)

    def remove(self) -> None:
        """Remove the session's directory and everything in it (no process of the session may run)."""
        if self.mounted:
            tmpfs.unmount(self.workspace)  # its files go with it
            self.mounted = False
        try:
            fd = os.open(self.path, _DIR_FLAGS)
        except FileNotFoundError:
            return
        try:
            clear(fd)
        finally:
            os.close(fd)
        os.rmdir(self.path)


class _Counter:
    """Adds up a tree's blocks, holding one descriptor per level (at most `MAX_DEPTH`)."""

    def __init__(self) -> None:
        self.bytes = 0
        self.entries = 0

    def walk(self, fd: int, depth: int) -> bool:
        """Count the tree at `fd`; False once it is too deep or too large to count."""
        subdirectories = []
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    self.entries += 1
                    if self.entries > MAX_ENTRIES:
                        return False
                    with contextlib.suppress(OSError):  # gone meanwhile: the code is running
                        self.bytes += entry.stat(follow_symlinks=False).st_blocks * 512
                        if entry.is_dir(follow_symlinks=False):
                            subdirectories.append(entry.name)
        except OSError:
            return True
        if subdirectories and depth + 1 > MAX_DEPTH:
            return False
        for name in subdirectories:
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError:  # replaced by a link or a file meanwhile: not followed
                continue
            try:
                if not self.walk(child, depth + 1):
                    return False
            finally:
                os.close(child)
        return True


def clear(top: int) -> None:
    """Remove everything inside the directory `top`, at any depth, holding two descriptors at a time.

    It goes down one directory at a time and back up through `..`, checking each time that `..`
    is the very directory it came from (device and inode), so a tree that changed under it is an
    error, never a walk elsewhere. Meant for a tree no process writes to any more.

    Raises:
        OSError: something could not be removed.
    """
    trail: list[tuple[str, int, int]] = []  # (name, device, inode of its parent) of each level entered
    current = os.dup(top)
    try:
        while True:
            below = _unlink_files(current)
            if below is not None:
                child = _enter(current, below)
                parent = os.fstat(current)
                trail.append((below, parent.st_dev, parent.st_ino))
                os.close(current)
                current = child
                continue
            if not trail:
                return
            name, device, inode = trail.pop()
            parent_fd = os.open("..", _DIR_FLAGS, dir_fd=current)
            parent = os.fstat(parent_fd)
            if (parent.st_dev, parent.st_ino) != (device, inode):
                os.close(parent_fd)
                msg = "a directory moved while it was being removed"
                raise WorkspaceError(msg)
            os.close(current)
            current = parent_fd
            os.rmdir(name, dir_fd=current)
    finally:
        os.close(current)


def _unlink_files(fd: int) -> str | None:
    """Unlink every non-directory in `fd`; the name of one subdirectory left, if any."""
    subdirectory = None
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                subdirectory = subdirectory or entry.name
            else:
                os.unlink(entry.name, dir_fd=fd)
    return subdirectory


def _enter(parent: int, name: str) -> int:
    """A descriptor of directory `name` in `parent`, made writable by us if the code locked it."""
    try:
        child = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except PermissionError:
        # Only without root (the code runs as the service's user and may chmod 000 its own dirs).
        # No process of the session runs any more, so the name cannot be swapped in between.
        os.chmod(name, 0o700, dir_fd=parent)
        child = os.open(name, _DIR_FLAGS, dir_fd=parent)
    os.fchmod(child, 0o700)
    return child
