"""Ports for child processes: outside the ephemeral range, free, consecutive, never issued twice."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from atmosphere.testing import free_port, free_port_block, ports


def _range_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ip_local_port_range"
    path.write_text(text)
    return path


def test_blocks_lie_outside_the_ephemeral_range_and_never_repeat() -> None:
    low, high = ports.ephemeral_range()
    seen: set[int] = set()
    for _ in range(50):
        start = free_port_block(12)
        block = set(range(start, start + 12))
        assert all(port < low or port > high for port in block)
        assert all(ports.LOWEST <= port <= 65_535 for port in block)
        assert seen.isdisjoint(block)
        seen |= block


def test_a_port_something_holds_is_never_part_of_a_block(monkeypatch: pytest.MonkeyPatch) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", free_port()))
    held = holder.getsockname()[1]
    try:
        # The first choice overlaps the held port: refused, and a block elsewhere is chosen.
        choose, first = ports._choose.choice, [held - 1]
        monkeypatch.setattr(ports._choose, "choice", lambda starts: first.pop() if first else choose(starts))
        start = free_port_block(3)
        assert not first
        assert held not in range(start, start + 3)
    finally:
        holder.close()


def test_the_range_is_read_from_the_kernel_and_defaults_to_linuxs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ports, "_EPHEMERAL_RANGE", _range_file(tmp_path, "20000\t40000\n"))
    assert ports.ephemeral_range() == (20_000, 40_000)
    start = free_port_block(4)
    assert all(not 20_000 <= port <= 40_000 for port in range(start, start + 4))
    monkeypatch.setattr(ports, "_EPHEMERAL_RANGE", tmp_path / "missing")
    assert ports.ephemeral_range() == (32_768, 60_999)
    monkeypatch.setattr(ports, "_EPHEMERAL_RANGE", _range_file(tmp_path, "garbage"))
    assert ports.ephemeral_range() == (32_768, 60_999)


def test_a_range_covering_every_port_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_EPHEMERAL_RANGE", _range_file(tmp_path, "1024 65535"))
    with pytest.raises(RuntimeError, match="leaves no room for 2 ports"):
        free_port_block(2)
    with pytest.raises(ValueError, match="a block of 0 ports"):
        free_port_block(0)


def test_a_port_another_process_claimed_is_never_issued_and_a_dead_ones_claim_is_taken_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ports, "CLAIMS", tmp_path / "claims")
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    dead_pid = int(ended.stdout)
    live, dead = free_port(), free_port()  # free, and now ours in this process only
    ports._issued.difference_update({live, dead})
    (tmp_path / "claims").mkdir(exist_ok=True)
    (tmp_path / "claims" / str(live)).write_text(str(os.getppid()))  # a live process: the test's parent
    (tmp_path / "claims" / str(dead)).write_text(str(dead_pid))
    choose, first = ports._choose.choice, [dead, live]
    monkeypatch.setattr(ports._choose, "choice", lambda starts: first.pop() if first else choose(starts))
    assert free_port() == dead  # `live` refused, then the dead process's claim taken over
    assert not first
    assert (tmp_path / "claims" / str(dead)).read_text() == str(os.getpid())
    assert (tmp_path / "claims" / str(live)).read_text() == str(os.getppid())
