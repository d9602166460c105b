"""`CodeSessions`: a sandbox per run, made lazily, reused, serialised, capped, released, reaped."""

from __future__ import annotations

import asyncio

import pytest

from atmosphere.sandbox.code import CodeSessions, CodeSettings, SessionUnavailableError

from .fakes import FakeBackend


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sessions_on(
    backend: FakeBackend, *, ttl: float = 10, max_sessions: int | None = None, clock: Clock | None = None
) -> CodeSessions:
    settings = CodeSettings(sandbox_ttl_seconds=ttl)
    if clock is None:
        return CodeSessions(backend, settings, max_sessions=max_sessions)
    return CodeSessions(backend, settings, max_sessions=max_sessions, clock=clock)


async def test_a_run_gets_one_sandbox_made_on_its_first_call_and_kept() -> None:
    backend = FakeBackend()
    sessions = sessions_on(backend)
    assert backend.opened == []
    await sessions.exec("run-1", "python", "1")
    await sessions.exec("run-1", "bash", "2")
    await sessions.exec("run-2", "python", "3")
    assert [(s.session_id, s.runs) for s in backend.opened] == [
        ("run-1", [("python", "1"), ("bash", "2")]),
        ("run-2", [("python", "3")]),
    ]
    assert (len(sessions), "run-1" in sessions) == (2, True)
    await sessions.close()


async def test_executions_of_one_run_wait_for_each_other_and_runs_do_not() -> None:
    backend = FakeBackend(delay=0.05)
    sessions = sessions_on(backend)
    await asyncio.gather(*(sessions.exec("run-1", "python", str(i)) for i in range(4)))
    await asyncio.gather(*(sessions.exec(f"run-{i}", "python", "x") for i in range(2, 5)))
    assert [s.most_running for s in backend.opened] == [1, 1, 1, 1]
    assert len(backend.opened[0].runs) == 4
    await sessions.close()


async def test_too_many_sessions_are_refused_with_a_reason() -> None:
    sessions = sessions_on(FakeBackend(), max_sessions=2)
    await sessions.exec("a", "python", "1")
    await sessions.exec("b", "python", "1")
    with pytest.raises(SessionUnavailableError, match="2 code sessions are already open"):
        await sessions.exec("c", "python", "1")
    await sessions.release("a")
    await sessions.exec("c", "python", "1")
    await sessions.close()


async def test_release_tears_down_and_a_later_call_starts_afresh() -> None:
    backend = FakeBackend()
    sessions = sessions_on(backend)
    await sessions.exec("run-1", "python", "1")
    await sessions.release("run-1")
    await sessions.release("run-1")  # nothing left: no error
    assert backend.opened[0].closed
    await sessions.exec("run-1", "python", "2")
    assert len(backend.opened) == 2
    assert not backend.opened[1].closed
    await sessions.close()


async def test_idle_sessions_are_reaped_busy_ones_are_not() -> None:
    clock = Clock()
    backend = FakeBackend(delay=0.2)
    sessions = sessions_on(backend, clock=clock)
    await sessions.exec("idle", "python", "1")
    busy = asyncio.create_task(sessions.exec("busy", "python", "1"))
    await asyncio.sleep(0.05)
    clock.now += 9
    assert await sessions.reap() == 0
    clock.now += 2
    assert await sessions.reap() == 1
    assert ("idle" in sessions, "busy" in sessions) == (False, True)
    await busy
    await sessions.close()


async def test_the_reaper_runs_by_itself() -> None:
    backend = FakeBackend()
    sessions = sessions_on(backend, ttl=0.1)
    await sessions.exec("run-1", "python", "1")
    for _ in range(100):
        if backend.opened[0].closed:
            break
        await asyncio.sleep(0.02)
    assert "run-1" not in sessions
    assert backend.opened[0].closed
    await sessions.close()


async def test_a_failed_open_is_an_unavailable_session_and_the_next_call_retries() -> None:
    backend = FakeBackend(fail_opens=1)
    sessions = sessions_on(backend)
    with pytest.raises(SessionUnavailableError, match="refused"):
        await sessions.exec("run-1", "python", "1")
    assert "run-1" not in sessions
    assert (await sessions.exec("run-1", "python", "1")).exit_code == 0
    await sessions.close()


async def test_release_while_the_sandbox_is_being_made_answers_the_waiting_call() -> None:
    backend = FakeBackend(open_delay=0.2)
    sessions = sessions_on(backend)
    call = asyncio.create_task(sessions.exec("run-1", "python", "1"))
    await asyncio.sleep(0.05)
    await sessions.release("run-1")
    with pytest.raises(SessionUnavailableError, match="released"):
        await call


async def test_after_close_every_call_is_refused() -> None:
    backend = FakeBackend()
    sessions = sessions_on(backend)
    await sessions.exec("a", "python", "1")
    await sessions.exec("b", "python", "1")
    await sessions.close()
    assert all(s.closed for s in backend.opened)
    assert len(sessions) == 0
    with pytest.raises(SessionUnavailableError, match="stopping"):
        await sessions.exec("c", "python", "1")
