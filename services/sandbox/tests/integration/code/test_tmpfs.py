"""Each workspace's own tmpfs: mounted with its session, gone with it, and swept after a crash."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from atmosphere.sandbox.code import tmpfs
from atmosphere.sandbox.code.workspace import SessionDirectory


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "sessions"
    root.mkdir()
    if os.geteuid() != 0 or (why := tmpfs.unavailable(root)) is not None:
        pytest.skip(f"this process cannot mount a tmpfs ({'not root' if os.geteuid() else why})")
    return root


def gone_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_a_workspace_is_a_tmpfs_of_its_own_until_its_session_is_removed(root: Path) -> None:
    directory = SessionDirectory(root, "run-1", owner=None, tmpfs_bytes=1 << 20)
    assert tmpfs.mounted_under(root) == [directory.workspace]
    assert (directory.workspace / "artifacts").is_dir()
    directory.remove()
    assert tmpfs.mounted_under(root) == []
    assert list(root.iterdir()) == []


def test_the_workspaces_of_a_service_that_is_gone_are_unmounted(root: Path) -> None:
    pid = gone_pid()
    stale = root / f"run-0-{pid}-0123456789ab" / "workspace"
    stale.mkdir(parents=True)
    tmpfs.mount(stale, 1 << 20, None)
    live = SessionDirectory(root, "run-2", owner=None, tmpfs_bytes=1 << 20)
    try:
        assert tmpfs.sweep_stale(root) == 1
        assert tmpfs.mounted_under(root) == [live.workspace]  # this process's own is kept
    finally:
        live.remove()
        tmpfs.unmount(stale)


def test_a_session_directory_names_its_service(root: Path) -> None:
    directory = SessionDirectory(root, "a-b-c", owner=None)
    try:
        assert tmpfs.owner_pid(directory.path.name) == os.getpid()
        assert not directory.mounted
    finally:
        directory.remove()
