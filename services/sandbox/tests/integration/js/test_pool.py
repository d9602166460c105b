"""`EvalPool`'s processes: replaced when they die, killed when their call is cancelled, all gone
after `close`, started with nothing of the service's environment, and not growing with use."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from atmosphere.sandbox.js.pool import EvalPool
from atmosphere.sandbox.js.protocol import MAX_CODE_CHARS

from .conftest import SMALL, children, closed_without_leftovers, environment_of, rss_kib, running


async def busy_worker(pool: EvalPool, task: asyncio.Task[object]) -> int:
    """The pid of the worker running `task`'s endless loop, once the loop is running."""
    await asyncio.sleep(0.15)
    assert not task.done()
    (pid,) = pool.worker_pids()
    return pid


async def test_a_worker_killed_mid_call_is_a_clear_error_and_is_replaced(pool: EvalPool) -> None:
    task = asyncio.create_task(pool.evaluate("while (true) {}"))
    pid = await busy_worker(pool, task)
    os.kill(pid, signal.SIGKILL)
    outcome = await task
    assert outcome.kind == "stopped"
    assert outcome.text == "Error: the JavaScript worker stopped (killed by SIGKILL); the call was not completed"
    assert (await pool.evaluate("'again'")).text == "again"
    assert pool.worker_pids() != [pid]


async def test_cancelling_the_call_kills_its_worker(pool: EvalPool) -> None:
    task = asyncio.create_task(pool.evaluate("while (true) {}"))
    pid = await busy_worker(pool, task)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    deadline = time.monotonic() + 2.0
    while running(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert not running(pid)  # killed and reaped, well before its own timeout would have ended the loop
    assert (await pool.evaluate("1 + 1")).text == "2"


async def test_close_leaves_no_process_even_with_calls_in_flight() -> None:
    pool = EvalPool(SMALL.model_copy(update={"workers": 2}))
    assert await pool.start() == "ACTIVE(mini-racer)"
    pids = pool.worker_pids()
    assert len(pids) == 2
    assert set(pids) <= children()
    calls = [asyncio.create_task(pool.evaluate("while (true) {}")) for _ in range(2)]
    await asyncio.sleep(0.1)
    await closed_without_leftovers(pool)
    for outcome in await asyncio.gather(*calls):
        assert outcome.is_error
    assert (await pool.evaluate("1")).text == "Error: eval is shutting down"


async def test_a_worker_has_none_of_the_services_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATMOSPHERE_NATS__TOKEN", "secret-token")
    monkeypatch.setenv("LLM_API_KEY", "sk-secret")
    pool = EvalPool(SMALL)
    await pool.start()
    try:
        (pid,) = pool.worker_pids()
        environment = environment_of(pid)
        assert "secret" not in " ".join(environment.values())
        assert set(environment) <= {"PATH", "LANG", "PYTHONDONTWRITEBYTECODE", "PYTHONPATH"}
        assert os.readlink(f"/proc/{pid}/cwd") == "/"
    finally:
        await closed_without_leftovers(pool)


async def test_two_workers_evaluate_at_once_and_more_calls_wait_their_turn() -> None:
    pool = EvalPool(SMALL.model_copy(update={"workers": 2}))
    await pool.start()
    try:
        outcomes = await asyncio.gather(*(pool.evaluate(f"{n} * 2") for n in range(6)))
        assert [outcome.text for outcome in outcomes] == [str(n * 2) for n in range(6)]
        assert len(pool.worker_pids()) == 2
    finally:
        await closed_without_leftovers(pool)


async def test_a_pool_not_started_starts_a_worker_on_its_first_call() -> None:
    pool = EvalPool(SMALL)
    try:
        assert pool.worker_pids() == []
        assert (await pool.evaluate("'lazy'")).text == "lazy"
        assert len(pool.worker_pids()) == 1
        assert await pool.start() == "ACTIVE(mini-racer)"  # the running worker is kept, not doubled
        assert len(pool.worker_pids()) == 1
    finally:
        await closed_without_leftovers(pool)


async def test_code_over_the_limit_is_refused_before_any_worker_sees_it(pool: EvalPool) -> None:
    outcome = await pool.evaluate("1;" * (MAX_CODE_CHARS // 2 + 1))
    assert outcome.kind == "invalid"
    assert outcome.text.startswith(f"Error: the code is {MAX_CODE_CHARS + 2} characters long")


async def test_a_thousand_evaluations_do_not_grow_the_worker(pool: EvalPool) -> None:
    code = "const rows = []; for (let i = 0; i < 200; i++) rows.push({i, s: 'r' + i}); JSON.stringify(rows).length"
    for _ in range(50):  # warm: the allocator's arenas and V8's code caches settle first
        await pool.evaluate(code)
    (pid,) = pool.worker_pids()
    before = rss_kib(pid)
    started = time.monotonic()
    for _ in range(1000):
        outcome = await pool.evaluate(code)
    elapsed = time.monotonic() - started
    after = rss_kib(pid)
    assert outcome.kind == "result"
    assert pool.worker_pids() == [pid]
    print(f"1000 evaluations: {elapsed:.2f} s; worker RSS {before} KiB -> {after} KiB")
    assert after < before * 1.10


async def test_a_call_that_finds_no_free_worker_in_time_is_told_so() -> None:
    pool = EvalPool(SMALL, queue_wait=0.1)
    await pool.start()
    try:
        looping = asyncio.create_task(pool.evaluate("while (true) {}"))
        await asyncio.sleep(0.05)
        waiting = await pool.evaluate("1")
        assert (waiting.kind, waiting.text) == (
            "busy",
            "Error: eval is busy: no JavaScript worker was free within 0.1 s",
        )
        assert (await looping).kind == "timeout"
        assert (await pool.evaluate("1")).text == "1"
    finally:
        await closed_without_leftovers(pool)


READY = '{"ready":true,"version":"stand-in","v8":"none","data_limit":1}'


@pytest.mark.parametrize(
    "reply",
    [
        'echo \'{"id":99,"kind":"result","text":"","truncated":false}\'',  # another call's id
        "echo 'not a frame'",
        "head -c 2000000 /dev/zero | tr '\\0' x",  # one line over the reply bound
    ],
)
async def test_a_worker_breaking_the_protocol_is_killed_and_the_call_is_an_error(tmp_path: Path, reply: str) -> None:
    # A stand-in for the interpreter: says ready as a worker would, then answers wrongly.
    broken = tmp_path / "broken-python"
    broken.write_text(f"#!/bin/sh\necho '{READY}'\nread request\n{reply}\nsleep 30\n")
    broken.chmod(0o755)
    pool = EvalPool(SMALL, python=str(broken))
    assert await pool.start() == "ACTIVE(mini-racer)"
    (pid,) = pool.worker_pids()
    outcome = await pool.evaluate("1")
    assert (outcome.kind, outcome.text) == (
        "stopped",
        "Error: the JavaScript worker stopped (it sent a malformed reply); the call was not completed",
    )
    assert pool.worker_pids() == []
    await closed_without_leftovers(pool)
    assert not running(pid)


SERVICE = """
import asyncio
from atmosphere.sandbox.js.pool import EvalPool
from atmosphere.sandbox.js.settings import EvalSettings

async def main():
    pool = EvalPool(EvalSettings(enabled=True, timeoutMillis=1000))
    await pool.start()
    print(*pool.worker_pids(), flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


def exited(pid: int) -> bool:
    """Gone, or a zombie nobody reaped yet (its parent died; init reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


async def test_a_worker_whose_service_was_killed_exits_by_itself() -> None:
    service = await asyncio.create_subprocess_exec(sys.executable, "-c", SERVICE, stdout=asyncio.subprocess.PIPE)
    assert service.stdout is not None
    (pid,) = [int(word) for word in (await asyncio.wait_for(service.stdout.readline(), 30)).split()]
    service.kill()  # SIGKILL: no `close`, the worker only sees its stdin end
    await service.wait()
    deadline = time.monotonic() + 5.0
    while not exited(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert exited(pid)
