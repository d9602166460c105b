"""A control group per execution: its limits, killing everything in it, and what limit it hit.

Each execution gets fresh groups (cgroup v1: one per controller, `pids`, `memory`, `cpu` and
`freezer`; v2: one group), made under the service's own groups, named
`atmo-code-<service pid>-<n>`. The sandbox's first process joins them before it runs anything (see
`launcher`), so all it starts is counted and bounded, and can be found again to be killed: the
group, not a process tree that can be escaped by re-parenting, is what "the execution" means.

Without write access to the hierarchy (not root, no delegated v2 subtree) there are no groups;
`detect` says why, and the sandbox falls back to rlimits.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

PREFIX: Final = "atmo-code-"
"""Every group made here is named `atmo-code-<service pid>-<n>`."""
CFS_PERIOD_US: Final = 100_000
V1_CONTROLLERS: Final = ("pids", "memory", "cpu", "freezer")
V1_REQUIRED: Final = ("pids", "memory")
V2_CONTROLLERS: Final = ("pids", "memory", "cpu")
EMPTY_POLL_SECONDS: Final = 0.01

_sequence = itertools.count(1)


@dataclass(frozen=True, slots=True)
class CgroupLimits:
    """What one execution may use."""

    memory_bytes: int
    pids: int
    cpus: float


@dataclass(frozen=True, slots=True)
class _Mount:
    fstype: str
    root: str
    point: Path
    options: frozenset[str]


def _mounts(mountinfo: str) -> list[_Mount]:
    mounts = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        if len(fields) < dash + 4 or fields[dash + 1] not in {"cgroup", "cgroup2"}:
            continue
        options = frozenset(fields[dash + 3].split(","))
        mounts.append(_Mount(fields[dash + 1], fields[3], Path(fields[4]), options))
    return mounts


def _own_groups(proc_cgroup: str) -> dict[str, str]:
    """The service's own group per controller (`""` keys its v2 group)."""
    groups: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        _hierarchy, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            groups[controller] = path
    return groups


def _under(mount: _Mount, own: str) -> Path:
    """Where our groups go in `mount`: under the service's own group (seen from the mount's root)."""
    root = mount.root.rstrip("/")
    relative = own[len(root) :] if own.startswith(root) else ""
    return mount.point / relative.lstrip("/")


def _writable(parent: Path) -> str | None:
    """Why groups cannot be made under `parent` (None: they can)."""
    probe = parent / f"{PREFIX}{os.getpid()}-probe-{next(_sequence)}"
    try:
        probe.mkdir()
    except OSError as exc:
        return f"{parent}: {exc.strerror or exc}"
    with contextlib.suppress(OSError):
        probe.rmdir()
    return None


@dataclass(frozen=True, slots=True)
class CgroupHost:
    """Where and how this host makes execution groups."""

    version: Literal[1, 2]
    parents: Mapping[str, Path]
    """v1: controller → the directory groups are made in; v2: `""` → that directory."""
    missing: tuple[str, ...] = field(default=())
    """v1 controllers that could not be used (`cpu`, `freezer` are optional)."""

    @property
    def controllers(self) -> tuple[str, ...]:
        """The controllers that bound an execution."""
        return tuple(self.parents) if self.version == 1 else V2_CONTROLLERS

    def sweep_stale(self) -> int:
        """Remove the empty groups a service process that is gone left (it crashed mid-execution); how many.

        Groups are named after their service's pid, so another live instance's are never touched,
        and a group that still holds a process is not removable anyway.
        """
        removed = 0
        for parent in self.parents.values():
            with contextlib.suppress(OSError):
                for child in parent.iterdir():
                    owner = child.name.removeprefix(PREFIX).split("-", 1)[0]
                    if not child.name.startswith(PREFIX) or not owner.isdigit() or pid_alive(int(owner)):
                        continue
                    with contextlib.suppress(OSError):
                        child.rmdir()
                        removed += 1
        return removed

    def create(self, limits: CgroupLimits) -> ExecCgroup:
        """Fresh groups with `limits` (removed again if a limit cannot be written).

        Raises:
            OSError: the groups could not be made.
        """
        name = f"{PREFIX}{os.getpid()}-{next(_sequence)}"
        group = ExecCgroup(self.version, [parent / name for parent in self.parents.values()])
        try:
            for directory in group.dirs:
                directory.mkdir()
            _write_limits(self.version, group.dirs, limits)
        except OSError:
            group.remove_empty()
            raise
        return group


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists (one of another user's counts too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_limits(version: Literal[1, 2], dirs: Iterable[Path], limits: CgroupLimits) -> None:
    quota = max(int(limits.cpus * CFS_PERIOD_US), 1000)
    for directory in dirs:
        files = {entry.name for entry in directory.iterdir()}
        values: list[tuple[str, str]] = []
        if version == 1:
            values += [("pids.max", str(limits.pids))]
            # memsw (memory plus swap) must be written after the memory limit, and not below it.
            values += [("memory.limit_in_bytes", str(limits.memory_bytes))]
            values += [("memory.memsw.limit_in_bytes", str(limits.memory_bytes))]
            values += [("cpu.cfs_period_us", str(CFS_PERIOD_US)), ("cpu.cfs_quota_us", str(quota))]
        else:
            values += [("pids.max", str(limits.pids)), ("memory.max", str(limits.memory_bytes))]
            values += [("memory.swap.max", "0"), ("cpu.max", f"{quota} {CFS_PERIOD_US}")]
        for file, value in values:
            if file in files:
                (directory / file).write_text(value)


class ExecCgroup:
    """The groups of one execution."""

    def __init__(self, version: Literal[1, 2], dirs: list[Path]) -> None:
        """Groups at `dirs` (not yet made)."""
        self.version = version
        self.dirs = dirs

    def procs_files(self) -> list[str]:
        """The `cgroup.procs` files the sandbox's first process writes its pid to, to join."""
        return [str(directory / "cgroup.procs") for directory in self.dirs]

    def pids(self) -> set[int]:
        """Every process in the groups now."""
        found: set[int] = set()
        for directory in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                found.update(int(line) for line in (directory / "cgroup.procs").read_text().split())
        return found

    def kill(self) -> None:
        """SIGKILL every process in the groups, at once and without waiting.

        The group is frozen first when it can be (nothing in it can fork while we list it); a
        process that still slipped in is killed by `destroy`, which repeats this until none is left.
        """
        kill_file = self.dirs[0] / "cgroup.kill" if self.version == 2 else None
        if kill_file is not None and kill_file.exists():
            with contextlib.suppress(OSError):
                kill_file.write_text("1")
                return
        freezer = self._freezer_state()
        if freezer is not None:
            with contextlib.suppress(OSError):
                freezer.write_text("FROZEN")
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if freezer is not None:  # a killed process in a frozen group only dies once thawed
            with contextlib.suppress(OSError):
                freezer.write_text("THAWED")

    def _freezer_state(self) -> Path | None:
        for directory in self.dirs:
            if (directory / "freezer.state").exists():
                return directory / "freezer.state"
        return None

    async def destroy(self, timeout: float = 5.0) -> bool:
        """Kill until no process is left, then remove the groups; False if some outlived `timeout`."""
        deadline = time.monotonic() + timeout
        while self.pids():
            if time.monotonic() > deadline:
                self.remove_empty()
                return False
            self.kill()
            await asyncio.sleep(EMPTY_POLL_SECONDS)
        self.remove_empty()
        return not any(directory.exists() for directory in self.dirs)

    def remove_empty(self) -> None:
        """Remove the groups that exist and hold no process (a group with processes stays)."""
        for directory in self.dirs:
            with contextlib.suppress(FileNotFoundError, OSError):
                directory.rmdir()

    def limit_hit(self) -> Literal["memory", "pids"] | None:
        """The limit the execution ran into: `memory` if the OOM killer struck, `pids` if a fork failed."""
        for directory in self.dirs:
            for file, key in (("memory.oom_control", "oom_kill"), ("memory.events", "oom_kill")):
                if _counter(directory / file, key) > 0:
                    return "memory"
        for directory in self.dirs:
            if _counter(directory / "pids.events", "max") > 0:
                return "pids"
        return None


def _counter(path: Path, key: str) -> int:
    """The value of `key` in a flat-keyed cgroup file (`key value` lines); 0 when absent."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def detect(
    mountinfo: Path = Path("/proc/self/mountinfo"), proc_cgroup: Path = Path("/proc/self/cgroup")
) -> CgroupHost | str:
    """How this host makes execution groups, or why it cannot (then rlimits alone bound code)."""
    try:
        mounts = _mounts(mountinfo.read_text())
        own = _own_groups(proc_cgroup.read_text())
    except (OSError, ValueError) as exc:
        return f"cgroups unreadable ({exc})"
    v1: dict[str, _Mount] = {c: m for m in mounts if m.fstype == "cgroup" for c in V1_CONTROLLERS if c in m.options}
    if any(c in v1 for c in V1_REQUIRED):
        return _v1(v1, own)
    unified = next((m for m in mounts if m.fstype == "cgroup2"), None)
    if unified is None:
        return "no cgroup hierarchy mounted"
    return _v2(unified, own)


def _v1(mounts: Mapping[str, _Mount], own: Mapping[str, str]) -> CgroupHost | str:
    parents: dict[str, Path] = {}
    problems: list[str] = []
    for controller in V1_CONTROLLERS:
        if controller not in mounts:
            problems.append(f"{controller}: not mounted")
            continue
        parent = _under(mounts[controller], own.get(controller, "/"))
        reason = _writable(parent)
        if reason is None:
            parents[controller] = parent
        else:
            problems.append(reason)
    if not all(c in parents for c in V1_REQUIRED):
        return "cannot make cgroups (" + "; ".join(problems) + ")"
    return CgroupHost(1, parents, tuple(c for c in V1_CONTROLLERS if c not in parents))


def _v2(mount: _Mount, own: Mapping[str, str]) -> CgroupHost | str:
    parent = _under(mount, own.get("", "/"))
    try:
        available = set((parent / "cgroup.controllers").read_text().split())
        enabled = set((parent / "cgroup.subtree_control").read_text().split())
        for controller in V2_CONTROLLERS:
            if controller not in enabled and controller in available:
                (parent / "cgroup.subtree_control").write_text(f"+{controller}")
    except OSError as exc:
        # The usual cause: the service's own group holds processes ("no internal processes").
        return f"cgroup v2: cannot enable controllers in {parent} ({exc.strerror or exc}); delegate a subtree"
    if not {"pids", "memory"} <= available:
        return f"cgroup v2: pids or memory controller not available in {parent}"
    reason = _writable(parent)
    return reason if reason is not None else CgroupHost(2, {"": parent})
