"""How a tool worker's memory is bounded: a memory cgroup of its own, else an RSS watchdog.

A cgroup (v1 `memory.limit_in_bytes`, or v2 `memory.max`) is exact: the kernel counts every page
the worker and its children touch and kills inside the group at the limit. It is created under
the sandbox's own memory cgroup, and the worker joins it itself as the first thing it does
(`cgroup.procs`), before it imports the app, so no user code runs outside it. Where no cgroup can
be created (not root, a read-only or undelegated hierarchy), the parent polls the worker's
`VmRSS` instead and kills it past the limit: coarser (a fast allocator overshoots by what it
allocates between two polls; the worker's own children are not counted), and said so in the log.

`RLIMIT_AS` is not used: it bounds address space, not memory, and libraries that reserve large
virtual arenas (numpy/OpenBLAS, onnxruntime, every thread's stack) fail to import under a limit
their real use would never reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

WATCHDOG_INTERVAL: Final = 0.05
"""Seconds between two looks at a worker's resident memory when no cgroup bounds it."""

_serials = itertools.count(1)
_PREFIX: Final = "atmosphere-tool-worker-"


@dataclass(frozen=True, slots=True)
class MemoryCgroup:
    """A memory cgroup that holds one tool worker."""

    path: Path
    version: int

    @property
    def procs(self) -> Path:
        """The file a process writes its pid into to join the group."""
        return self.path / "cgroup.procs"

    @classmethod
    def create(cls, limit_bytes: int) -> MemoryCgroup | str:
        """A new group limited to `limit_bytes`, or why none can be made here."""
        found = _own_memory_cgroup()
        if isinstance(found, str):
            return found
        parent, version = found
        path = parent / f"{_PREFIX}{os.getpid()}-{next(_serials)}"
        try:
            path.mkdir()
        except OSError as exc:
            return f"cannot create a memory cgroup under {parent} ({exc.strerror or exc})"
        group = cls(path, version)
        reason = group._limit(limit_bytes)
        if reason:
            group.remove()
            return reason
        return group

    def _limit(self, limit_bytes: int) -> str:
        limit, swap, no_swap = (
            (_knob("limit_in_bytes"), _knob("memsw.limit_in_bytes"), str(limit_bytes))
            if self.version == 1
            else (_knob("max"), _knob("swap.max"), "0")
        )
        try:
            (self.path / limit).write_text(str(limit_bytes))
        except OSError as exc:
            return f"cannot set {limit} in {self.path} ({exc.strerror or exc})"
        # Swap would let a worker grow past its limit; where the kernel accounts it, it is held to the same.
        with contextlib.suppress(OSError):
            (self.path / swap).write_text(no_swap)
        return ""

    def holds(self, pid: int) -> bool:
        """Whether process `pid` is in this group."""
        return pid in self.pids()

    def pids(self) -> list[int]:
        """The processes in this group."""
        try:
            return [int(line) for line in self.procs.read_text().split()]
        except (OSError, ValueError):
            return []

    def oom_kills(self) -> int:
        """How many processes the kernel killed in this group for going over its limit."""
        name = _knob("oom_control") if self.version == 1 else _knob("events")
        try:
            text = (self.path / name).read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def kill_all(self) -> None:
        """SIGKILL every process still in the group (what a worker left behind)."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def remove(self) -> bool:
        """Remove the group (it must be empty); whether it is gone."""
        try:
            self.path.rmdir()
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True

    async def dispose(self, *, attempts: int = 50) -> None:
        """Kill what is left in the group and remove it (the kernel frees a group a moment after its last exit)."""
        for _ in range(attempts):
            self.kill_all()
            if self.remove():
                return
            await asyncio.sleep(0.02)


def remove_stale_cgroups() -> None:
    """Remove the groups a sandbox that died (its pid is gone) left behind, killing what is still in them."""
    found = _own_memory_cgroup()
    if isinstance(found, str):
        return
    directory, version = found
    for path in directory.glob(f"{_PREFIX}*-*"):
        owner = path.name.removeprefix(_PREFIX).split("-")[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            group = MemoryCgroup(path, version)
            group.kill_all()
            group.remove()


def _knob(name: str) -> str:
    """The file of the memory controller's `name` in a group (`memory.max`, `memory.limit_in_bytes`)."""
    return f"memory.{name}"


def _own_memory_cgroup() -> tuple[Path, int] | str:
    """The directory of this process's memory cgroup and the hierarchy's version, or why there is none."""
    try:
        memberships = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError as exc:
        return f"cannot read this process's cgroups ({exc.strerror or exc})"
    for line in memberships:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return _located(mounts, path, version=1)
    for line in memberships:
        if line.startswith("0::"):
            return _located(mounts, line[3:], version=2)
    return "no memory cgroup hierarchy is mounted"


def _located(mounts: list[str], path: str, *, version: int) -> tuple[Path, int] | str:
    for line in mounts:
        fields = line.split()
        separator = fields.index("-")
        fstype, options = fields[separator + 1], fields[separator + 3].split(",")
        if (version == 1 and fstype == "cgroup" and "memory" in options) or (version == 2 and fstype == "cgroup2"):
            root, mount = fields[3], Path(fields[4])
            relative = path[len(root) :] if path.startswith(root) else path
            directory = mount / relative.lstrip("/")
            if version == 2 and "memory" not in _read(directory / "cgroup.subtree_control").split():
                return f"the cgroup v2 group {directory} does not delegate the memory controller"
            return (directory if directory.is_dir() else mount), version
    return f"the cgroup v{version} memory hierarchy is not mounted"


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def resident_bytes(pid: int) -> int:
    """Process `pid`'s resident memory (`VmRSS`), 0 when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def watch_resident_memory(pid: int, limit_bytes: int, exceeded: Callable[[], None]) -> None:
    """Call `exceeded` once process `pid` holds more than `limit_bytes` of resident memory."""
    while True:
        await asyncio.sleep(WATCHDOG_INTERVAL)
        if resident_bytes(pid) > limit_bytes:
            exceeded()
            return
