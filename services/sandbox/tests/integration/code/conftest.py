"""`code_exec` test support: small limits, a workspace root the sandbox user can reach, and `leftovers`.

Every test here has the sandbox user to itself (`sandbox_user`, autouse: no other test process
on the host runs a sandbox meanwhile), and ends with no process of a sandbox left and no control group of ours left
(`no_leftovers`, autouse): whatever a test did, its executions were cleaned up within 2 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from atmosphere.sandbox.code import CodeSessions, CodeSettings, probe
from atmosphere.sandbox.code.bwrap import SANDBOX_UID, BwrapBackend
from atmosphere.sandbox.code.cgroups import PREFIX, CgroupHost, detect

SETTLE_SECONDS = 2.0


def small_settings(**overrides: object) -> CodeSettings:
    """Settings with the escape suite's small limits (3 s, 64 pids, 128 MiB, 1 MiB per stream)."""
    values: dict[str, object] = {
        "enabled": True,
        "engine": "bwrap",
        "exec_timeout_seconds": 3,
        "pids_limit": 64,
        "memory": "128m",
        "max_output_bytes": 1024 * 1024,
        "workspace_bytes": 64 * 1024 * 1024,
    }
    return CodeSettings.model_validate(values | overrides)


def our_group_prefix() -> str:
    """The name prefix of the control groups this test process makes."""
    return f"{PREFIX}{os.getpid()}-"


def _cgroup_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return ""


def _status(pid: int) -> dict[str, str]:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def _descends_from(pid: int, ancestor: int) -> bool:
    for _ in range(64):
        parent = _status(pid).get("PPid", "0").strip()
        if not parent.isdigit() or int(parent) <= 1:
            return False
        if int(parent) == ancestor:
            return True
        pid = int(parent)
    return False


def sandbox_processes() -> list[tuple[int, str]]:
    """Processes of our sandboxes now: in one of our groups, or below us running as the sandbox user."""
    prefix, me = our_group_prefix(), os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        status = _status(pid)
        if not status or status.get("State", "").startswith("Z"):
            continue
        uid = status.get("Uid", "").split()
        ours = prefix in _cgroup_of(pid) or (uid and uid[0] == str(SANDBOX_UID) and _descends_from(pid, me))
        if ours:
            found.append((pid, status.get("Name", "?")))
    return found


@functools.cache
def _host_groups() -> CgroupHost | str:
    return detect()


def our_groups() -> list[Path]:
    """Control groups of ours that still exist."""
    host = _host_groups()
    if isinstance(host, str):
        return []
    prefix = our_group_prefix()
    return [
        child
        for parent in host.parents.values()
        for child in parent.iterdir()
        if child.is_dir() and child.name.startswith(prefix) and "-probe-" not in child.name
    ]


def leftovers() -> list[str]:
    """What our sandboxes left behind: processes and control groups (empty is the only good answer)."""
    return [f"pid {pid} ({name})" for pid, name in sandbox_processes()] + [str(g) for g in our_groups()]


def settled_leftovers(timeout: float = SETTLE_SECONDS) -> list[str]:
    """`leftovers()` once it is empty, or what is still there after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while (found := leftovers()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


@pytest.fixture(autouse=True)
def no_leftovers(sandbox_user: None) -> Iterator[None]:
    """Every test ends with nothing of its sandboxes left (processes, control groups) within 2 s.

    The sandbox user is this test's from before it starts until its sandboxes are gone.
    """
    yield
    assert settled_leftovers() == []


@pytest.fixture(scope="session")
def bwrap_ready() -> str:
    """The bwrap backend's note; the test is skipped (saying why) only where bwrap cannot isolate."""
    availability = asyncio.run(probe(small_settings()))
    if not availability.active:
        pytest.skip(f"code_exec sandbox {availability.label}")
    return availability.reason


@pytest.fixture(scope="session")
def code_root() -> Iterator[Path]:
    """A workspace root the sandbox user can reach (pytest's tmp dirs are 0700, closed to it)."""
    root = Path(tempfile.mkdtemp(prefix="atmo-code-tests-", dir="/tmp"))
    root.chmod(0o711)
    yield root / "sessions"
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def host_groups() -> CgroupHost:
    """This host's control groups (the suite needs them: CI runs as root, with cgroups)."""
    host = _host_groups()
    if isinstance(host, str):
        pytest.skip(f"no cgroups here: {host}")
    return host


def bwrap_backend(root: Path, **overrides: object) -> BwrapBackend:
    """A bwrap backend with the small settings (and `overrides`)."""
    return BwrapBackend(small_settings(**overrides), root)


@pytest_asyncio.fixture
async def sessions(bwrap_ready: str, code_root: Path) -> AsyncIterator[CodeSessions]:
    """Sessions on a bwrap backend with the small settings; all closed at the end."""
    backend = bwrap_backend(code_root)
    code_sessions = CodeSessions(backend, backend.settings)
    try:
        yield code_sessions
    finally:
        with contextlib.suppress(Exception):
            await code_sessions.close()
