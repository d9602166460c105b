"""A filesystem of its own for each session's workspace, when the service may mount one.

Why: a bind mount shows where its source lives in `/proc/self/mountinfo` (the fourth field is the
directory's path inside its filesystem), so code bound to `<root>/<session>/workspace` could read
the host path of its session. A tmpfs mounted on the workspace is a filesystem whose root *is*
the workspace: the code sees `/` there and `tmpfs` as its source, nothing of the host's layout.
Mounting needs CAP_SYS_ADMIN, which a service started as root has (as it must be for the sandbox
to run as `nobody`); a service that cannot mount keeps plain directories and logs why.

Its size is twice the workspace budget: the budget is still the sandbox's own watch (the code is
stopped and the workspace emptied past it); the tmpfs bounds what fast code writes between two
checks. Its pages count against the execution's memory limit, as a container's tmpfs does.

A service killed with sessions open leaves their mounts behind: the next one to start unmounts
those whose service process is gone (a session directory's name carries its service's pid).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
from pathlib import Path
from typing import Final

from atmosphere.sandbox.code.cgroups import pid_alive

MS_NOSUID: Final = 0x2
MS_NODEV: Final = 0x4
MNT_DETACH: Final = 0x2
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")

_libc = ctypes.CDLL(None, use_errno=True)


def _failed(path: Path) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, os.strerror(code), str(path))


def mount(path: Path, size: int, owner: tuple[int, int] | None) -> None:
    """Mount a tmpfs of `size` bytes on the directory `path`, its root mode 0700 and owned by `owner`.

    Raises:
        OSError: it could not be mounted (EPERM without CAP_SYS_ADMIN).
    """
    options = f"size={size},mode=0700" + (f",uid={owner[0]},gid={owner[1]}" if owner is not None else "")
    if _libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", MS_NOSUID | MS_NODEV, options.encode()) != 0:
        raise _failed(path)


def unmount(path: Path) -> None:
    """Detach the tmpfs on `path` (its memory goes once nothing uses it); nothing mounted there is fine.

    Raises:
        OSError: it could not be unmounted.
    """
    if _libc.umount2(os.fsencode(path), MNT_DETACH) != 0 and ctypes.get_errno() not in {errno.EINVAL, errno.ENOENT}:
        raise _failed(path)


def unavailable(root: Path) -> str | None:
    """Why this process cannot mount a tmpfs under `root` (None: it can; one is mounted and unmounted)."""
    probe = root / f".tmpfs-probe-{os.getpid()}"
    try:
        probe.mkdir(mode=0o700, parents=True, exist_ok=True)
        mount(probe, 4096, None)
        unmount(probe)
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()
    return None


def owner_pid(session_directory: str) -> int | None:
    """The pid of the service that made a session directory named `<label>-<pid>-<id>` (None if not one)."""
    parts = session_directory.rsplit("-", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def sweep_stale(root: Path) -> int:
    """Unmount the workspaces under `root` whose service process is gone; how many."""
    swept = 0
    for mount_point in mounted_under(root):
        pid = owner_pid(mount_point.parent.name)
        if pid is None or pid == os.getpid() or pid_alive(pid):
            continue
        try:
            unmount(mount_point)
        except OSError:
            continue
        swept += 1
    return swept


def mounted_under(root: Path) -> list[Path]:
    """The mount points below `root` in this process's mount namespace."""
    prefix = str(root.resolve()) + "/"
    found = []
    for line in Path("/proc/self/mountinfo").read_text(encoding="utf-8", errors="replace").splitlines():
        fields = line.split(" ")
        if len(fields) > 4:
            point = _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields[4])
            if point.startswith(prefix):
                found.append(Path(point))
    return found
