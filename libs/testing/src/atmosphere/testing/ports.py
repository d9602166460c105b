"""TCP ports for processes that cannot report the port they bound (`atmosphere dev`, nats-server routes).

A port the kernel hands out for port 0 lies in its ephemeral range, the range every outgoing
connection on the machine takes its local port from. Between the check and the child's own bind
any connection may take it, and a connected socket holds it for as long as it lives (seen: a
`dev --cluster 3` node's route port "already in use" in a full test run, with ~100 connections
opening while the stack starts). So these ports come from outside that range, where no connect()
lands, each checked free by binding it, and none is handed out twice: not by one test process,
nor by two at once (parallel test workers, the floors' lane beside the suite). A port is claimed
across processes by a file named after it in `CLAIMS` holding the claimant's pid; a claim whose
process is gone is taken over, so a killed run leaves nothing that blocks the next.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import tempfile
from pathlib import Path

LOWEST = 10_000
"""Below this sit the well-known and registered ports of common services (postgres, redis...)."""
_HIGHEST = 65_535
_ATTEMPTS = 1000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LINUX_DEFAULT_EPHEMERAL = (32_768, 60_999)

CLAIMS = Path(tempfile.gettempdir()) / f"atmosphere-test-ports-{os.getuid()}"
"""Where ports are claimed across processes: one file per port, holding the claimant's pid."""

_issued: set[int] = set()
_choose = random.SystemRandom()  # independent of any seeding of `random` a test run does


def free_port() -> int:
    """A TCP port on 127.0.0.1 free a moment ago and out of the kernel's ephemeral range."""
    return free_port_block(1)


def free_port_block(count: int) -> int:
    """The first of `count` consecutive TCP ports on 127.0.0.1, each free a moment ago.

    For a process given a base port and counting up from it (`--probe-base-port`, a cluster's
    `--nats-cluster-port`): every port of the block is checked, not only the first.
    """
    if count < 1:
        raise ValueError(f"a block of {count} ports")
    starts = _block_starts(count)
    for _ in range(_ATTEMPTS):
        start = _choose.choice(starts)
        block = range(start, start + count)
        if _issued.isdisjoint(block) and all(_bindable(port) for port in block) and _claim(block):
            _issued.update(block)
            return start
    raise RuntimeError(f"no {count} consecutive free TCP ports outside the ephemeral range in {_ATTEMPTS} tries")


def _block_starts(count: int) -> list[int]:
    """Where a block of `count` can start so that all of it is outside the ephemeral range."""
    low, high = ephemeral_range()
    starts = [*range(LOWEST, low - count + 1), *range(max(high + 1, LOWEST), _HIGHEST - count + 2)]
    if not starts:
        raise RuntimeError(f"the ephemeral range {low}-{high} leaves no room for {count} ports")
    return starts


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of local ports for outgoing connections (Linux's default if unreadable)."""
    try:
        low, high = (int(part) for part in _EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        return _LINUX_DEFAULT_EPHEMERAL
    return low, high


def _claim(block: range) -> bool:
    """Claim every port of `block` for this process, or none (another process holds one)."""
    CLAIMS.mkdir(mode=0o700, exist_ok=True)
    taken: list[int] = []
    for port in block:
        if not _claim_one(port):
            for mine in taken:
                with contextlib.suppress(OSError):
                    (CLAIMS / str(mine)).unlink()
            return False
        taken.append(port)
    return True


def _claim_one(port: int) -> bool:
    path = CLAIMS / str(port)
    for _ in range(2):  # once more after taking over a dead process's claim
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            if not _claim_is_stale(path):
                return False
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        with os.fdopen(fd, "w") as claim:
            claim.write(str(os.getpid()))
        return True
    return False


def _claim_is_stale(path: Path) -> bool:
    """Whether the process that claimed `path` is gone (a claim being written is not stale)."""
    try:
        pid = int(path.read_text() or "0")
    except (OSError, ValueError):
        return False
    if pid == os.getpid():
        return False  # ours, from an earlier issue in this process
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
