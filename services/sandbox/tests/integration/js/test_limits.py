"""The worker's own backstops: no core dumps, a data-segment limit, and why not `RLIMIT_AS`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from atmosphere.sandbox.js.pool import EvalPool

from .conftest import HEAP_BYTES, OUTPUT_CHARS, TIMEOUT_MS

WORKER = [
    "-m",
    "atmosphere.sandbox.js.worker",
    f"--timeout-ms={TIMEOUT_MS}",
    f"--max-memory-bytes={HEAP_BYTES}",
    f"--max-output-chars={OUTPUT_CHARS}",
]


def limit_of(pid: int, name: str) -> str:
    """The soft value of one line of `/proc/<pid>/limits`, e.g. `Max core file size`."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith(name):
            return line[len(name) :].split()[0]
    raise AssertionError(f"no {name!r} limit")


async def test_a_worker_dumps_no_core_and_has_a_bounded_data_segment(pool: EvalPool) -> None:
    (pid,) = pool.worker_pids()
    assert limit_of(pid, "Max core file size") == "0"
    data = limit_of(pid, "Max data size")
    assert data != "unlimited"
    # What V8 needs at rest plus room for one evaluation: bounded, yet far above the heap limit.
    assert 2 * HEAP_BYTES < int(data) < 4 * 1024**3


def test_an_address_space_limit_would_keep_v8_from_starting() -> None:
    # V8 reserves about a terabyte of address space at start, so even 8 GiB of RLIMIT_AS is too little.
    under_limit = (
        "import os, resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))\n"
        "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", under_limit, *WORKER],
        input=b"",
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert done.returncode != 0
    first = done.stdout.splitlines()[:1]
    assert not first or json.loads(first[0]).get("ready") is not True
