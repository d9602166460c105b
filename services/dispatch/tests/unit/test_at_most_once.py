"""Without durable runs (the default) a run taken over never runs a tool call again that may have run.

A worker's death is its task being cancelled at a chosen point (the stream and the journal keep
what was written, as after a kill -9); the redelivery goes to a second executor. A worker that
only stalled is one whose run gets a successor's lease while it goes on. The real-process
version (SIGKILL, two workers, a real broker) is tests/e2e/test_default_mode_takeover.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import pytest

from atmosphere.bus import Envelope, Headers, Nak, WorkItem, subjects
from atmosphere.bus.errors import RunInterruptedError
from atmosphere.contracts.journal.v1.journal_pb2 import EffectKind, JournalRecord
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, RunSubmission, ToolResult, ToolStart
from atmosphere.dispatch import durability
from atmosphere.dispatch.effects import tool_call_key
from atmosphere.dispatch.handlers import RunExecutor
from atmosphere.dispatch.interrupted import StartedCall, interrupted_error, started_calls
from atmosphere.dispatch.journal import RunJournal, RunTakenOverError, canonical_json
from atmosphere.dispatch.settings import DispatchOptions
from atmosphere.sdk import App, agent, tool
from atmosphere.sdk.runtime import ToolSpec
from atmosphere.testing import ToolCallScript, Turn, wait_until

from .conftest import Harness, kinds, request


@tool
def book(city: str) -> str:
    """Book a hotel (a side effect: never run twice)."""
    return "unused: the stand-in sandbox answers"


@tool(idempotent=True)
def forecast(city: str) -> str:
    """Read the forecast (safe to run again)."""
    return "unused"


@agent(name="travel", system_prompt="Be brief.", tools=[book, forecast])
class Travel:
    """Answers with the model and two tools."""


APP = App(agents=[Travel])
PARIS = ToolCallScript("book", {"city": "Paris"}, call_id="c1")


def work_item(run: RunSubmission, delivered: int) -> WorkItem[RunSubmission]:
    return WorkItem(Envelope(subjects.run_submit(run.agent), run, Headers()), stream_seq=1, delivered=delivered)


def worker(harness: Harness, owner: str) -> RunExecutor:
    """A worker as dispatch runs it by default: durable runs off."""
    return harness.executor(APP, owner=owner)


async def _true(value: bool) -> bool:
    return value


async def die_when(executor: RunExecutor, run: RunSubmission, condition: Callable[[], Awaitable[bool]]) -> None:
    """Run a first delivery until `condition`, then stop its worker dead (the task is cancelled)."""
    task = asyncio.create_task(executor.on_work(work_item(run, 1)))
    await wait_until(condition, timeout=10, what="the point to die at")
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def text_of(events: list[RunEvent]) -> str:
    return "".join(e.text_delta.text for e in events if e.WhichOneof("kind") == "text_delta")


def one_terminal(events: list[RunEvent]) -> RunEvent:
    """The run's only terminal event, last, after an unbroken run of seqs."""
    assert [e.seq for e in events] == list(range(2, len(events) + 2))
    terminals = [e for e in events if e.WhichOneof("kind") in {"complete", "error"}]
    assert len(terminals) == 1
    assert terminals[0] is events[-1]
    return terminals[0]


def journal_records(harness: Harness, run_id: str = "r1") -> list[JournalRecord]:
    return [
        JournalRecord.FromString(data)
        for subject, data in harness.bus.stream_messages(subjects.JOURNAL_STREAM)
        if subject == subjects.run_journal(run_id)
    ]


# -- a worker died: what the next one does ------------------------------------------------------


async def test_a_tool_under_way_when_its_worker_died_is_not_run_again_and_the_run_ends_naming_it(
    harness: Harness,
) -> None:
    await harness.serve_tools({"book": "booked #1"}, delay=2)
    harness.provider.script(Turn.tool_calls(PARIS, text="Booking. "))
    run = request("travel", "Book Paris")
    await die_when(worker(harness, "w1"), run, lambda: _true(len(harness.tool_calls) == 1))

    harness.provider.script(Turn.tool_calls(PARIS, text="Booking. "), Turn.text("Booked twice!"))  # if asked again
    await worker(harness, "w2").on_work(work_item(run, 2))

    assert len(harness.tool_calls) == 1  # the booking was never made a second time
    assert len(harness.provider.requests) == 1  # nor was the model asked to choose again
    error = one_terminal(harness.events()).error
    assert error.code == RunInterruptedError.code
    assert "book (call c1, may or may not have taken effect)" in error.message
    assert dict(error.details) == {"tools": "book", "calls": "c1"}
    assert [r.run_id for r in harness.policy.ended] == ["r1"]  # what its admission took is given back
    assert journal_records(harness)[-1].WhichOneof("record") == "terminal"  # a trace for a holder that may wake


async def test_a_finished_tool_is_not_run_again_when_its_worker_died_during_the_answer(harness: Harness) -> None:
    await harness.serve_tools({"book": "booked #1"})
    harness.provider.script(
        Turn.tool_calls(PARIS), Turn.text("Your room in Paris is booked and paid.", chunk_delay=0.2)
    )
    run = request("travel", "Book Paris")
    await die_when(worker(harness, "w1"), run, lambda: _true(len(text_of(harness.events())) > 5))

    await worker(harness, "w2").on_work(work_item(run, 2))

    assert len(harness.tool_calls) == 1
    assert len(harness.provider.requests) == 2
    error = one_terminal(harness.events()).error
    assert error.code == RunInterruptedError.code
    assert "book (call c1, finished)" in error.message


async def test_a_run_whose_worker_died_before_any_tool_started_is_re_driven_to_its_end(harness: Harness) -> None:
    # Not new (the run was always re-driven then); the guard only ends runs that started a call.
    await harness.serve_tools({"book": "booked #1"})
    slow = dataclasses.replace(Turn.tool_calls(PARIS, text="Booking it for you now. "), chunk_delay=0.3)
    harness.provider.script(slow)
    run = request("travel", "Book Paris")
    await die_when(worker(harness, "w1"), run, lambda: _true(len(text_of(harness.events())) > 3))
    assert harness.tool_calls == []

    harness.provider.script(Turn.tool_calls(PARIS, text="Booking it for you now. "), Turn.text("Booked."))
    await worker(harness, "w2").on_work(work_item(run, 2))

    assert len(harness.tool_calls) == 1
    events = harness.events()
    assert one_terminal(events).WhichOneof("kind") == "complete"
    assert text_of(events) == "Booking it for you now. Booked."


async def test_an_idempotent_tool_under_way_is_run_again_and_the_run_goes_on(harness: Harness) -> None:
    # Not new either: a tool declared safe to repeat may be, so the run continues.
    await harness.serve_tools({"forecast": "sunny"}, delay=0.5)
    weather = ToolCallScript("forecast", {"city": "Paris"}, call_id="c1")
    harness.provider.script(Turn.tool_calls(weather))
    run = request("travel", "Weather?")
    await die_when(worker(harness, "w1"), run, lambda: _true(len(harness.tool_calls) == 1))

    harness.provider.script(Turn.tool_calls(weather), Turn.text("Sunny."))
    await worker(harness, "w2").on_work(work_item(run, 2))

    assert len(harness.tool_calls) == 2
    assert one_terminal(harness.events()).WhichOneof("kind") == "complete"


# -- a worker that only stalled is fenced ------------------------------------------------------


async def take_over(harness: Harness, run: RunSubmission) -> None:
    """Another worker takes the run (the stalled one's heartbeats stopped past the ack wait)."""
    await RunJournal.open(harness.bus, run.run_id, owner="w2", delivery=2)


async def test_a_stalled_worker_whose_run_was_taken_over_stops_writing_and_starts_no_tool(harness: Harness) -> None:
    await harness.serve_tools({"book": "booked #1"})
    words = " ".join(f"w{i}" for i in range(40))
    harness.provider.script(dataclasses.replace(Turn.tool_calls(PARIS, text=words), chunk_delay=0.05))
    run = request("travel", "Book Paris")
    task = asyncio.create_task(worker(harness, "w1").on_work(work_item(run, 1)))
    await wait_until(lambda: _true(len(text_of(harness.events())) > 5), what="the answer to stream")
    await take_over(harness, run)
    with pytest.raises(Nak):  # its delivery is handed back, never acked
        await task
    written = harness.events()
    assert harness.tool_calls == []  # the model's call came after the takeover: never made
    assert not {"complete", "error", "tool_start"} & set(kinds(written))
    assert len(text_of(written).split()) < 40  # it stopped within about a second
    assert len(harness.provider.requests) == 1


async def test_a_stalled_worker_taken_over_just_before_a_tool_call_does_not_make_it(harness: Harness) -> None:
    # No check was due yet (the run is younger than a second): the call's start marker is refused.
    await harness.serve_tools({"book": "booked #1"})
    harness.policy.check_delay = 0.3
    harness.provider.script(Turn.tool_calls(PARIS))
    run = request("travel", "Book Paris")
    task = asyncio.create_task(worker(harness, "w1").on_work(work_item(run, 1)))
    await wait_until(lambda: _true(len(harness.policy.checks) == 1), what="the tool call's governance check")
    await take_over(harness, run)
    with pytest.raises(Nak):
        await task
    assert harness.tool_calls == []
    assert not {"complete", "error"} & set(kinds(harness.events()))


async def test_a_stalled_worker_that_never_wrote_its_journal_learns_its_successor_ended_the_run(
    harness: Harness,
) -> None:
    # Its successor's journal stays (a terminal record): an empty subject would look untouched.
    harness.provider.script(Turn.text("Hello there my friend", chunk_delay=2.0))
    run = request("travel", "Hi")
    stalled = asyncio.create_task(worker(harness, "w1").on_work(work_item(run, 1)))
    await wait_until(lambda: _true(len(text_of(harness.events())) > 0), what="the first word")
    harness.provider.script(Turn.text("Hello there my friend"))
    await worker(harness, "w2").on_work(work_item(run, 2))  # the whole run, while w1 waits on its model
    with pytest.raises(Nak):
        await stalled
    events = harness.events()
    assert one_terminal(events).WhichOneof("kind") == "complete"
    assert text_of(events) == "Hello there my friend"


async def test_a_holder_whose_late_write_equals_its_successors_record_still_learns_it_was_taken_over(
    harness: Harness,
) -> None:
    # Records carry no owner: the successor starting the same call writes the very same marker.
    key = tool_call_key("r1", "forecast", canonical_json({"city": "Paris"}), 0)
    first = await RunJournal.open(harness.bus, "r1", owner="w1", delivery=1)
    second = await RunJournal.open(harness.bus, "r1", owner="w2", delivery=2)
    await second.pending(EffectKind.EFFECT_KIND_TOOL_CALL, key, "d")
    with pytest.raises(RunTakenOverError):
        await first.pending(EffectKind.EFFECT_KIND_TOOL_CALL, key, "d")
    assert first.lost
    unread = RunJournal.unread(harness.bus, "r1", owner="w1")
    with pytest.raises(RunTakenOverError):
        await unread.pending(EffectKind.EFFECT_KIND_TOOL_CALL, key, "d")


# -- what it costs ------------------------------------------------------------------------------


@pytest.fixture
def journal_use(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every bus call on `ATMO_JOURNAL`, by method name (a spy on the in-memory bus).

    The lease check (a `last_message` about once a second while a run writes) is put a minute
    away: a loaded machine may stretch these runs past one second, and what they count is the
    run's own use of its journal. A lease check due at the run's start would still show.
    """
    monkeypatch.setattr(durability, "LEASE_CHECK_INTERVAL", 60.0)
    used: list[str] = []
    bus: Any = harness.bus
    for name in ("js_publish", "last_message", "purge"):
        method = getattr(bus, name)

        async def spy(first: str, *args: Any, _name: str = name, _method: Any = method, **kwargs: Any) -> Any:
            if first == subjects.JOURNAL_STREAM or first == subjects.run_journal("r1"):
                used.append(_name)
            return await _method(first, *args, **kwargs)

        setattr(bus, name, spy)
    replay = bus.replay_sequenced

    async def replay_spy(stream: str, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
        if stream == subjects.JOURNAL_STREAM:
            used.append("replay_sequenced")
        async for item in replay(stream, *args, **kwargs):
            yield item

    bus.replay_sequenced = replay_spy
    return used


async def test_a_run_that_calls_no_tool_never_touches_the_journal(harness: Harness, journal_use: list[str]) -> None:
    harness.provider.script(Turn.text("Hello there, traveller."))
    await worker(harness, "w1").on_work(work_item(request("travel", "Hi"), 1))
    assert one_terminal(harness.events()).WhichOneof("kind") == "complete"
    assert journal_use == []


async def test_a_short_durable_run_asks_its_journal_nothing_beyond_its_lease(
    harness: Harness, journal_use: list[str]
) -> None:
    # The first takeover check comes a second after the run was taken: nobody else can hold it sooner.
    harness.provider.script(Turn.text("Hello there, traveller."))
    executor = harness.executor(APP, durable=True, owner="w1")
    await executor.on_work(work_item(request("travel", "Hi"), 1))
    assert "last_message" not in journal_use


async def test_a_tool_calls_start_marker_is_journaled_before_it_runs_and_removed_with_the_run(
    harness: Harness, journal_use: list[str]
) -> None:
    await harness.serve_tools({"book": "booked #1"}, delay=0.5)
    harness.provider.script(Turn.tool_calls(PARIS), Turn.text("Booked."))
    task = asyncio.create_task(worker(harness, "w1").on_work(work_item(request("travel", "Book Paris"), 1)))
    await wait_until(lambda: _true(len(harness.tool_calls) == 1), what="the tool call")
    [marker] = journal_records(harness)
    assert marker.effect.kind == EffectKind.EFFECT_KIND_TOOL_CALL
    assert marker.effect.status == 1  # pending: no result is ever journaled without durable runs
    await task
    assert journal_records(harness) == []
    assert journal_use == ["js_publish", "purge"]


def test_the_default_ack_wait_takes_a_run_over_within_seconds() -> None:
    assert DispatchOptions().run_ack_wait == 4.0


# -- naming what started -------------------------------------------------------------------------


def start(seq: int, name: str, arguments: dict[str, Any], call_id: str) -> RunEvent:
    return RunEvent(
        seq=seq, tool_start=ToolStart(tool_name=name, call_id=call_id, arguments_json=json.dumps(arguments))
    )


async def test_started_calls_are_named_after_their_tool_start_and_a_lost_one_is_not_guessed(
    harness: Harness,
) -> None:
    journal = RunJournal.unread(harness.bus, "r1", owner="w1")

    async def marked(name: str, arguments: dict[str, Any], occurrence: int) -> None:
        key = tool_call_key("r1", name, canonical_json(arguments), occurrence)
        await journal.pending(EffectKind.EFFECT_KIND_TOOL_CALL, key, "d")

    # Occurrence 0 of this call was refused before its tool-start: the started one is occurrence 1.
    await marked("book", {"city": "Paris"}, 1)
    await marked("forecast", {"city": "Rome"}, 0)
    await marked("book", {"city": "Oslo"}, 0)  # its tool-start never reached the stream
    stored = [
        start(3, "book", {"city": "Paris"}, "c1"),
        start(4, "forecast", {"city": "Rome"}, "c2"),
        RunEvent(seq=5, tool_result=ToolResult(tool_name="forecast", call_id="c2", result="sunny")),
        start(6, "book", {"city": "Lima"}, "c3"),  # refused after its tool-start: no marker
    ]
    calls = started_calls(journal, stored)
    assert calls == [
        StartedCall("book", "c1", finished=False),
        StartedCall("forecast", "c2", finished=True),
        StartedCall("", "", finished=False),
    ]
    tools = {"book": ToolSpec.of(book), "forecast": ToolSpec.of(forecast)}
    assert [call.may_repeat(tools) for call in calls] == [False, True, False]
    message = interrupted_error([calls[0], calls[2]]).message
    assert "book (call c1, may or may not have taken effect); a tool whose name was lost (" in message
