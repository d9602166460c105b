"""A failed run logs one line with its error code, named by its run; a run that succeeds logs none.

Runs are driven on the `FakeBus` harness (conftest.py); a handler on the dispatch logger keeps
every record with the run bound when it was logged (`atmosphere.bus.telemetry.current_run`),
which is what a service's log lines show as `run=` (`atmosphere.service.log_context`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from atmosphere.bus import Envelope, Headers, WorkItem, subjects
from atmosphere.bus.telemetry import RunTag, current_run
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.sdk import App, StreamingSession, agent, prompt

from .conftest import Harness, kinds, request

USER_TEXT = "my card number is 4111-1111-1111-1111"
FAILED = re.compile(r"^run (\S+) failed: (\S+)")


@agent(name="echo")
class Echo:
    @prompt
    async def on_prompt(self, message: str, session: StreamingSession) -> None:
        await session.send(message)


@agent(name="refusing")
class Refusing:
    @prompt
    async def on_prompt(self, message: str, session: StreamingSession) -> None:
        # The agent's own error text quotes the user: it must not reach the log.
        await session.error(f"cannot help with: {message}", code="agent.refused")


@agent(name="crashing")
class Crashing:
    @prompt
    async def on_prompt(self, message: str, session: StreamingSession) -> None:
        raise KeyError(message)


APP = App(agents=[Echo, Refusing, Crashing])


@dataclass
class Logged:
    level: int
    message: str
    run: RunTag | None


class Keeper(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.kept: list[Logged] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.kept.append(Logged(record.levelno, record.getMessage(), current_run()))

    def failed(self) -> list[tuple[str, str, Logged]]:
        return [(m[1], m[2], line) for line in self.kept if (m := FAILED.match(line.message))]


@pytest.fixture
def logged() -> Iterator[Keeper]:
    keeper = Keeper()
    logger = logging.getLogger("atmosphere.dispatch")
    level = logger.level
    logger.addHandler(keeper)
    logger.setLevel(logging.DEBUG)
    try:
        yield keeper
    finally:
        logger.removeHandler(keeper)
        logger.setLevel(level)


async def test_a_run_ended_by_its_agent_logs_one_line_with_the_code_and_none_of_the_text(
    harness: Harness, logged: Keeper
) -> None:
    await harness.executor(APP).execute(request("refusing", USER_TEXT))
    assert kinds(harness.events())[-1] == "error"
    [(run_id, code, line)] = logged.failed()
    assert (run_id, code, line.level) == ("r1", "agent.refused", logging.WARNING)
    assert line.run == RunTag("r1", "refusing")  # logged with the run bound: its line names it
    assert not any("4111" in each.message for each in logged.kept)


async def test_a_run_that_succeeds_logs_no_failure(harness: Harness, logged: Keeper) -> None:
    await harness.executor(APP).execute(request("echo", USER_TEXT))
    assert kinds(harness.events())[-1] == "complete"
    assert logged.failed() == []


async def test_a_refused_run_and_an_unknown_agent_log_their_codes(harness: Harness, logged: Keeper) -> None:
    executor = harness.executor(APP)
    harness.policy.admit = False
    await executor.execute(request("echo", run_id="r1"))
    await executor.execute(request("ghost", run_id="r2"))
    assert [(run_id, code) for run_id, code, _ in logged.failed()] == [
        ("r1", "governance.denied"),
        ("r2", "dispatch.unknown_agent"),
    ]


async def test_a_crash_keeps_its_traceback_and_adds_the_one_failed_line(harness: Harness, logged: Keeper) -> None:
    await harness.executor(APP).execute(request("crashing", USER_TEXT))
    [(run_id, code, line)] = logged.failed()
    assert (run_id, code, line.run) == ("r1", "agent.failed", RunTag("r1", "crashing"))
    # The traceback of an unexpected exception stays (the one line names its code, it says why).
    assert [each.message for each in logged.kept if each.level >= logging.ERROR] == ["agent crashing failed on run r1"]


async def test_a_poison_run_logs_its_one_failed_line_at_error(harness: Harness, logged: Keeper) -> None:
    executor = harness.executor(APP, max_deliveries=3)
    await harness.bus.publish(subjects.run_events("r1"), RunEvent(run_id="r1", seq=1))
    run = request("echo", "hi")
    await executor.on_work(WorkItem(Envelope(subjects.run_submit("echo"), run, Headers()), stream_seq=1, delivered=3))
    assert harness.events()[-1].error.code == "dispatch.run_abandoned"
    [(run_id, code, line)] = logged.failed()
    assert (run_id, code, line.level, line.run) == ("r1", "dispatch.run_abandoned", logging.ERROR, RunTag("r1", "echo"))
    assert "delivery 3 of at most 3" in line.message
