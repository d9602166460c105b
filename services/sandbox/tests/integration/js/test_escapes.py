"""S11: hostile JavaScript ends as an `Error: ...`, the test process (the service) survives, and
the next evaluation succeeds within a second, on one pool shared by every vector."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from atmosphere.sandbox.js.pool import EvalPool

from .conftest import HEAP_BYTES, TIMEOUT_MS

pytestmark = pytest.mark.asyncio(loop_scope="module")

TIMED_OUT = f"Error: eval timed out after {TIMEOUT_MS} ms"
OUT_OF_MEMORY = f"Error: eval ran out of memory (limit {HEAP_BYTES // (1024 * 1024)} MiB)"


async def still_serves(pool: EvalPool) -> None:
    """The next evaluation after a bad one succeeds (a dead worker replaced), waiting out no timeout.

    The bound is loose: a loaded machine (the suite's parallel lanes) stretches a worker's start.
    """
    started = time.monotonic()
    outcome = await pool.evaluate("[1, 2, 3].reduce((a, b) => a + b)")
    assert (outcome.kind, outcome.text) == ("result", "6")
    assert time.monotonic() - started <= 10.0


async def test_an_endless_loop_times_out_in_v8_at_its_timeout(shared_pool: EvalPool) -> None:
    before = shared_pool.worker_pids()
    started = time.monotonic()
    outcome = await shared_pool.evaluate("while (true) {}")
    elapsed = time.monotonic() - started
    assert (outcome.kind, outcome.text) == ("timeout", TIMED_OUT)
    assert TIMEOUT_MS / 1000 <= elapsed <= TIMEOUT_MS / 1000 + 5  # uncut: forever; slack for a loaded machine
    assert shared_pool.worker_pids() == before  # V8's own timeout: the worker was not killed
    await still_serves(shared_pool)


@pytest.mark.parametrize(
    ("code", "text"),
    [
        ("'x'.repeat(2**29)", "Error: RangeError: Invalid string length"),
        ("new ArrayBuffer(2**31)", "Error: RangeError: Array buffer allocation failed"),
        ("function down(n) { return down(n + 1) + 1 } down(0)", "Error: RangeError: Maximum call stack size exceeded"),
        # Memory outside the V8 heap (typed arrays) is bounded by the worker's data limit.
        (
            "const kept = []; for (let i = 0; i < 64; i++) kept.push(new Uint8Array(2**26).fill(1)); kept.length",
            "Error: RangeError: Array buffer allocation failed",
        ),
    ],
)
async def test_an_allocation_too_large_is_a_range_error(shared_pool: EvalPool, code: str, text: str) -> None:
    outcome = await shared_pool.evaluate(code)
    assert (outcome.kind, outcome.text) == ("error", text)
    await still_serves(shared_pool)


async def test_a_growing_array_hits_the_heap_limit(shared_pool: EvalPool) -> None:
    outcome = await shared_pool.evaluate(
        "const grow = []; while (true) grow.push(new Array(1 << 16).fill(grow.length))"
    )
    assert (outcome.kind, outcome.text) == ("oom", OUT_OF_MEMORY)
    await still_serves(shared_pool)


@pytest.mark.parametrize(
    "code",
    [
        "'x'.repeat(2**28)",  # a 256 MiB string, flattened to be cut: V8 aborts the worker
        "new Array(2**28).fill(0).length",  # one huge builtin call: V8 aborts, or it outlives the deadline
    ],
)
async def test_v8_aborting_the_worker_is_an_error_and_the_worker_is_replaced(shared_pool: EvalPool, code: str) -> None:
    before = shared_pool.worker_pids()
    outcome = await shared_pool.evaluate(code)
    assert outcome.kind in {"oom", "timeout"}
    assert outcome.text in {OUT_OF_MEMORY, TIMED_OUT}
    await still_serves(shared_pool)
    assert shared_pool.worker_pids() != before


async def test_an_endless_await_loop_times_out(shared_pool: EvalPool) -> None:
    outcome = await shared_pool.evaluate("(async () => { while (true) { await null } })()")
    assert (outcome.kind, outcome.text) == ("timeout", TIMED_OUT)
    await still_serves(shared_pool)


async def test_an_endless_microtask_chain_left_behind_is_stopped_with_its_isolate(shared_pool: EvalPool) -> None:
    outcome = await shared_pool.evaluate("function again() { Promise.resolve().then(again) } again()")
    assert (outcome.kind, outcome.text) == ("result", "undefined")
    (pid,) = shared_pool.worker_pids()
    cpu_before = cpu_seconds(pid)
    await asyncio.sleep(0.3)
    assert cpu_seconds(pid) - cpu_before < 0.15  # a chain still running would take the whole 0.3 s
    await still_serves(shared_pool)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (
            "[typeof require, typeof process, typeof fetch, typeof XMLHttpRequest, typeof WebAssembly, "
            "typeof Deno, typeof Bun, typeof module, typeof exports, typeof read, typeof load, typeof os]",
            '["undefined","undefined","undefined","undefined","undefined","undefined","undefined",'
            '"undefined","undefined","undefined","undefined","undefined"]',
        ),
        ("new Function('return this')().process === undefined", "true"),
        ("import('fs')", "Error: Error: Not supported"),
        ("import('/etc/passwd')", "Error: Error: Not supported"),
    ],
)
async def test_no_ambient_module_process_network_or_file_access(shared_pool: EvalPool, code: str, text: str) -> None:
    assert (await shared_pool.evaluate(code)).text == text


async def test_each_call_starts_from_a_fresh_global_scope(shared_pool: EvalPool) -> None:
    first = await shared_pool.evaluate("globalThis.leaked = 1; var hoisted = 2; Array.prototype.extra = 3; 'set'")
    assert first.text == "set"
    second = await shared_pool.evaluate("[typeof leaked, typeof hoisted, typeof [].extra]")
    assert second.text == '["undefined","undefined","undefined"]'
