"""Durable runs on the in-memory bus: a worker dies mid-run, another continues with nothing repeated.

A worker's death is its task being cancelled at a chosen point (the journal and the stream
keep what was written, as they would after a kill -9); the next delivery goes to a second
executor with another owner. The real-process version (kill -9, two workers, a real broker)
is tests/e2e/test_chaos.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable

import pytest

from atmosphere.bus import Envelope, Headers, Nak, WorkItem, subjects
from atmosphere.bus.errors import EffectLimitError
from atmosphere.bus.runs import ANSWER_REWOUND_METADATA_KEY
from atmosphere.contracts.journal.v1.journal_pb2 import EffectKind, JournalRecord
from atmosphere.contracts.run.v1.run_pb2 import (
    ApprovalDecision,
    Control,
    ControlAck,
    Metadata,
    RunEvent,
    RunSubmission,
    TextDelta,
    ToolStart,
)
from atmosphere.dispatch.handlers import RunExecutor
from atmosphere.dispatch.journal import RunJournal, RunTakenOverError, canonical_json, effect_key
from atmosphere.dispatch.resume import DeliveredEvents, same_events
from atmosphere.dispatch.tool_errors import INTERRUPTED
from atmosphere.sdk import App, agent, tool
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


@tool(requires_approval=True)
def pay(amount: int) -> str:
    """Pay (asks for approval)."""
    return "unused"


@agent(name="travel", system_prompt="Be brief.", tools=[book, forecast, pay])
class Travel:
    """Answers with the model and two tools."""


APP = App(agents=[Travel])


def work_item(run: RunSubmission, delivered: int) -> WorkItem[RunSubmission]:
    return WorkItem(Envelope(subjects.run_submit(run.agent), run, Headers()), stream_seq=1, delivered=delivered)


def durable(harness: Harness, owner: str) -> RunExecutor:
    return harness.executor(APP, durable=True, owner=owner)


async def die_when(executor: RunExecutor, run: RunSubmission, condition: Callable[[], Awaitable[bool]]) -> None:
    """Run a first delivery until `condition`, then stop its worker dead (the task is cancelled)."""
    task = asyncio.create_task(executor.on_work(work_item(run, 1)))
    await wait_until(condition, timeout=10, what="the point to die at")
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def text_of(events: list[RunEvent]) -> str:
    return "".join(e.text_delta.text for e in events if e.WhichOneof("kind") == "text_delta")


def assert_one_clean_stream(events: list[RunEvent]) -> None:
    assert [e.seq for e in events] == list(range(2, len(events) + 2))
    terminals = [k for k in kinds(events) if k in {"complete", "error"}]
    assert terminals == ["complete"]


async def test_a_tool_under_way_when_its_worker_died_is_reported_interrupted_not_run_again(harness: Harness) -> None:
    await harness.serve_tools({"book": "booked #1"}, delay=2)
    harness.provider.script(Turn.tool_calls(ToolCallScript("book", {"city": "Paris"}, call_id="c1"), text="Booking. "))
    run = request("travel", "Book Paris")
    await die_when(durable(harness, "w1"), run, lambda: _true(len(harness.tool_calls) == 1))

    harness.provider.script(Turn.text("I could not confirm the booking."))
    await durable(harness, "w2").on_work(work_item(run, 2))

    assert len(harness.tool_calls) == 1  # the booking was never made a second time
    assert len(harness.provider.requests) == 2  # round 0 replayed from the journal
    tool_message = harness.provider.requests[1]["messages"][-1]
    assert tool_message["content"] == INTERRUPTED.format(name="book")
    events = harness.events()
    assert_one_clean_stream(events)
    assert kinds(events).count("tool_start") == 1  # not sent again
    assert text_of(events) == "Booking. I could not confirm the booking."


async def test_an_idempotent_tool_under_way_when_its_worker_died_is_run_again(harness: Harness) -> None:
    await harness.serve_tools({"forecast": "sunny"}, delay=0.5)
    harness.provider.script(Turn.tool_calls(ToolCallScript("forecast", {"city": "Paris"}, call_id="c1")))
    run = request("travel", "Weather?")
    await die_when(durable(harness, "w1"), run, lambda: _true(len(harness.tool_calls) == 1))

    harness.provider.script(Turn.text("Sunny."))
    await durable(harness, "w2").on_work(work_item(run, 2))

    assert len(harness.tool_calls) == 2
    assert harness.provider.requests[1]["messages"][-1]["content"] == "sunny"
    assert_one_clean_stream(harness.events())


async def test_a_committed_tool_and_a_half_sent_answer_continue_without_repeats(harness: Harness) -> None:
    await harness.serve_tools({"book": "booked #1"})
    answer = "Your room in Paris is booked and paid for."
    harness.provider.script(
        Turn.tool_calls(ToolCallScript("book", {"city": "Paris"}, call_id="c1")),
        Turn.text(answer, chunk_delay=0.2),
    )
    run = request("travel", "Book Paris")

    async def answering() -> bool:
        return len(text_of(harness.events())) > 10

    await die_when(durable(harness, "w1"), run, answering)
    sent_before = text_of(harness.events())
    assert 10 < len(sent_before) < len(answer)

    harness.provider.script(Turn.text(answer))  # the round under way runs again (it was not committed)
    await durable(harness, "w2").on_work(work_item(run, 2))

    assert len(harness.tool_calls) == 1
    assert len(harness.provider.requests) == 3  # round 0 replayed; round 1 asked once more
    events = harness.events()
    assert_one_clean_stream(events)
    assert text_of(events) == answer  # the client's text goes on where it stopped
    assert kinds(events).count("tool_result") == 1


async def test_a_run_redelivered_after_it_committed_everything_calls_nothing(harness: Harness) -> None:
    await harness.serve_tools({"book": "booked #1"})
    harness.provider.script(
        Turn.tool_calls(ToolCallScript("book", {"city": "Paris"}, call_id="c1")), Turn.text("Done.")
    )
    run = request("travel", "Book Paris")
    executor = harness.executor(APP, durable=True, owner="w1", retain_on_success=True)
    await executor.on_work(work_item(run, 1))
    first = harness.events()
    journal = await RunJournal.open(harness.bus, run.run_id, owner="reader", delivery=0)
    assert {e.kind for e in journal.entries.values()} == {
        EffectKind.EFFECT_KIND_RUN_INPUT,
        EffectKind.EFFECT_KIND_LLM_ROUND,
        EffectKind.EFFECT_KIND_TOOL_CALL,
    }
    assert all(e.committed for e in journal.entries.values())
    assert kinds(first)[-1] == "complete"
    assert len(harness.provider.requests) == 2


async def test_a_succeeded_runs_journal_is_removed_a_failed_ones_kept(harness: Harness) -> None:
    harness.provider.script(Turn.text("Fine."), Turn.error("bad request", status=400))
    executor = durable(harness, "w1")
    await executor.on_work(work_item(request("travel", "ok", run_id="good"), 1))
    await executor.on_work(work_item(request("travel", "bad", run_id="bad"), 1))
    kept = {subject.rsplit(".", 1)[-1] for subject, _ in harness.bus.stream_messages(subjects.JOURNAL_STREAM)}
    assert kept == {"bad"}


async def test_a_later_holder_fences_the_earlier_one(harness: Harness) -> None:
    first = await RunJournal.open(harness.bus, "r1", owner="w1", delivery=1)
    second = await RunJournal.open(harness.bus, "r1", owner="w2", delivery=2)
    key = effect_key("r1", "tool", "book", "{}", 0)
    with pytest.raises(RunTakenOverError):
        await first.pending(EffectKind.EFFECT_KIND_TOOL_CALL, key, "d")
    assert first.lost
    await second.pending(EffectKind.EFFECT_KIND_TOOL_CALL, key, "d")
    await second.commit(key, "ok")
    third = await RunJournal.open(harness.bus, "r1", owner="w3", delivery=3)
    assert third.replayable(key, "d") is not None
    assert third.replayable(key, "another principal's digest") is None


async def test_the_effect_bound_fails_the_run_rather_than_dropping(harness: Harness) -> None:
    journal = await RunJournal.open(harness.bus, "r1", owner="w1", delivery=1, max_effects=2)
    await journal.pending(EffectKind.EFFECT_KIND_LLM_ROUND, "k1", "d")
    await journal.pending(EffectKind.EFFECT_KIND_LLM_ROUND, "k2", "d")
    await journal.pending(EffectKind.EFFECT_KIND_LLM_ROUND, "k2", "d")  # the same effect again is no new one
    with pytest.raises(EffectLimitError):
        await journal.pending(EffectKind.EFFECT_KIND_LLM_ROUND, "k3", "d")


async def test_a_durable_run_over_its_effect_bound_ends_with_an_error(harness: Harness) -> None:
    await harness.serve_tools({"forecast": "sunny"})
    harness.provider.script(Turn.tool_calls(ToolCallScript("forecast", {"city": "Paris"})), Turn.text("x"))
    executor = harness.executor(APP, durable=True, owner="w1", max_effects=2)
    await executor.on_work(work_item(request("travel", "go"), 1))
    last = harness.events()[-1]
    assert last.error.code == EffectLimitError.code


async def test_a_run_that_progresses_on_each_delivery_is_not_taken_for_poison(harness: Harness) -> None:
    journal = await RunJournal.open(harness.bus, "r1", owner="w1", delivery=1)
    assert journal.fruitless_deliveries == 1
    await journal.pending(EffectKind.EFFECT_KIND_LLM_ROUND, "k1", "d")
    await journal.commit("k1", "{}")
    again = await RunJournal.open(harness.bus, "r1", owner="w2", delivery=2)
    assert again.fruitless_deliveries == 1  # the first delivery committed something
    stuck = await RunJournal.open(harness.bus, "r1", owner="w3", delivery=3)
    assert stuck.fruitless_deliveries == 2


def test_keys_follow_atmospheres_effect_keys() -> None:
    assert canonical_json({"b": 1, "a": {"d": 2, "c": [3]}}) == '{"a":{"c":[3],"d":2},"b":1}'
    import hashlib

    expected = hashlib.sha256(b"r1\x00tool\x00book\x00{}\x000\x00").hexdigest()
    assert effect_key("r1", "tool", "book", "{}", 0) == expected


async def test_the_journal_record_is_readable_by_a_plain_subscriber(harness: Harness) -> None:
    await RunJournal.open(harness.bus, "r1", owner="w1", delivery=1)
    [(subject, data)] = harness.bus.stream_messages(subjects.JOURNAL_STREAM)
    assert subject == subjects.run_journal("r1")
    record = JournalRecord.FromString(data)
    assert (record.lease.owner, record.lease.delivery) == ("w1", 1)
    assert json.loads(json.dumps({"ok": True}))  # the payloads are JSON texts


def approvals(events: list[RunEvent]) -> list[str]:
    return [e.approval_required.approval_id for e in events if e.WhichOneof("kind") == "approval_required"]


async def decide(harness: Harness, approval_id: str, action: str) -> None:
    control = Control(run_id="r1", approval=ApprovalDecision(approval_id=approval_id, action=action))
    ack = await harness.bus.request(subjects.run_control("r1"), control, ControlAck)
    assert ack.accepted


async def test_an_approval_decided_before_the_worker_died_is_not_asked_again(harness: Harness) -> None:
    await harness.serve_tools({"pay": "paid 10"}, delay=2)
    harness.provider.script(Turn.tool_calls(ToolCallScript("pay", {"amount": 10}, call_id="c1")))
    run = request("travel", "Pay")
    first = asyncio.create_task(durable(harness, "w1").on_work(work_item(run, 1)))
    await wait_until(lambda: _true(bool(approvals(harness.events()))), what="the approval request")
    await decide(harness, approvals(harness.events())[0], "approve")
    await wait_until(lambda: _true(len(harness.tool_calls) == 1), what="the approved call")
    first.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await first

    harness.provider.script(Turn.text("Paid? Unsure."))
    await durable(harness, "w2").on_work(work_item(run, 2))  # nobody answers: it must not ask
    events = harness.events()
    assert len(approvals(events)) == 1
    assert len(harness.tool_calls) == 1  # the payment was under way: reported interrupted, not repeated
    assert_one_clean_stream(events)


async def test_an_approval_never_decided_is_asked_again_under_the_same_id(harness: Harness) -> None:
    await harness.serve_tools({"pay": "paid 10"})
    harness.provider.script(Turn.tool_calls(ToolCallScript("pay", {"amount": 10}, call_id="c1")))
    run = request("travel", "Pay")
    await die_when(durable(harness, "w1"), run, lambda: _true(bool(approvals(harness.events()))))
    [asked] = approvals(harness.events())

    harness.provider.script(Turn.text("Paid."))
    second = asyncio.create_task(durable(harness, "w2").on_work(work_item(run, 2)))
    await wait_until(lambda: _true(len(approvals(harness.events())) == 2), what="the approval asked again")
    assert approvals(harness.events()) == [asked, asked]  # an answer to the first asking still counts
    await decide(harness, asked, "approve")
    await second
    assert len(harness.tool_calls) == 1
    assert_one_clean_stream(harness.events())


def test_delivered_events_hold_back_only_what_was_sent() -> None:
    def event(seq: int, **kind: object) -> RunEvent:
        return RunEvent(run_id="r1", seq=seq, agent="a", **kind)  # type: ignore[arg-type]

    start = ToolStart(tool_name="t", call_id="c1", arguments_json="{}")
    stored = [event(1), event(2, text_delta=TextDelta(text="Hel")), event(3, tool_start=start)]
    stored.append(event(4, metadata=Metadata(key="ai.run.resumed", value_json="{}")))
    delivered = DeliveredEvents("r1", stored)
    # The re-drive, before the writer stamps its events: same text in other pieces, same tool start.
    assert delivered.admit(RunEvent(text_delta=TextDelta(text="He"))) == []
    [tail] = delivered.admit(RunEvent(text_delta=TextDelta(text="llo")))
    assert tail.text_delta.text == "lo"
    assert delivered.admit(RunEvent(tool_start=start)) == []
    assert len(delivered.admit(RunEvent(tool_start=start))) == 1  # a second, new call goes out
    marker = RunEvent(metadata=Metadata(key="ai.run.resumed", value_json="{}"))
    assert delivered.admit(marker) == [marker]
    assert not delivered.diverged


def test_a_diverging_resumed_answer_is_rewound_never_spliced() -> None:
    delivered = DeliveredEvents("r1", [RunEvent(seq=2, text_delta=TextDelta(text="Paris is the capit"))])
    assert delivered.admit(RunEvent(text_delta=TextDelta(text="Paris "))) == []
    rewound, text = delivered.admit(RunEvent(text_delta=TextDelta(text="has been the capital")))
    assert rewound.metadata.key == ANSWER_REWOUND_METADATA_KEY
    assert json.loads(rewound.metadata.value_json) == {"discard": len("is the capit")}
    assert text.text_delta.text == "has been the capital"
    assert delivered.diverged
    [rest] = delivered.admit(RunEvent(text_delta=TextDelta(text=" of France.")))  # goes out as it is
    assert rest.text_delta.text == " of France."
    # What the client ends with, applying the marker: the new answer, whole.
    answer = "Paris is the capit"[: -json.loads(rewound.metadata.value_json)["discard"]]
    assert answer + text.text_delta.text + rest.text_delta.text == "Paris has been the capital of France."


async def _true(value: bool) -> bool:
    return value


async def test_a_run_replayed_from_its_journal_with_the_provider_stopped_produces_the_same_events(
    harness: Harness,
) -> None:
    await harness.serve_tools({"book": "booked #1"})
    harness.provider.script(
        Turn.tool_calls(ToolCallScript("book", {"city": "Paris"}, call_id="c1"), text="Booking it. "),
        Turn.text("Your room in Paris is booked."),
    )
    run = request("travel", "Book Paris")
    # Recorded coalesced (every delta of a round after its first joined); replayed uncut.
    executor = harness.executor(APP, durable=True, owner="w1", retain_on_success=True, text_delta_window=30)
    await executor.on_work(work_item(run, 1))
    recorded = harness.events()
    assert kinds(recorded)[-1] == "complete"
    calls = len(harness.provider.requests)

    # No model (every further request would be an error), no tool: the journal alone.
    harness.provider.script()
    replayed = await harness.executor(APP, durable=True, owner="replayer").replay(run)
    assert len(harness.provider.requests) == calls
    assert len(harness.tool_calls) == 1
    assert same_events(recorded, replayed)
    assert kinds(recorded).count("text_delta") < kinds(replayed).count("text_delta")
    assert text_of(replayed) == "Booking it. Your room in Paris is booked."
    assert harness.events() == recorded  # nothing was written to the run's stream


async def test_a_replay_that_needs_the_model_ends_with_a_clear_error(harness: Harness) -> None:
    harness.provider.script(Turn.error("refused", status=400))
    run = request("travel", "x")
    await durable(harness, "w1").on_work(work_item(run, 1))  # failed: its journal is kept, round 0 pending
    replayed = await harness.executor(APP, durable=True, owner="replayer").replay(run)
    assert replayed[-1].error.code == "dispatch.replay_diverged"


async def test_a_holder_learns_it_was_taken_over_without_writing(harness: Harness) -> None:
    first = await RunJournal.open(harness.bus, "r1", owner="w1", delivery=1)
    assert await first.still_held()
    await RunJournal.open(harness.bus, "r1", owner="w2", delivery=2)
    assert not await first.still_held()
    assert first.lost


async def test_a_stalled_worker_whose_run_was_taken_over_stops_writing_its_events(harness: Harness) -> None:
    harness.provider.script(Turn.text(" ".join(f"w{i}" for i in range(60)), chunk_delay=0.05))
    run = request("travel", "Talk")
    executor = durable(harness, "w1")
    task = asyncio.create_task(executor.on_work(work_item(run, 1)))
    await wait_until(lambda: _true(len(text_of(harness.events())) > 5), what="the answer to stream")
    # Another worker takes the run over (this one's heartbeats stalled past the ack wait).
    await RunJournal.open(harness.bus, run.run_id, owner="w2", delivery=2)
    with pytest.raises(Nak):  # its delivery is handed back, never acked
        await task
    written = harness.events()
    assert "complete" not in kinds(written)
    assert len(text_of(written).split()) < 60  # it stopped within about a second
