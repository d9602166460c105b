"""Text deltas joined within a window (`CoalescedEvents`): fewer events, the same text, exact resumes.

The sink alone on a recording stand-in (what goes out, when, in which order), then whole runs
on the in-memory bus: a fast model's answer in fewer events, a slow model's unchanged, and a
coalesced run whose worker died resumed into exactly the text of an uncut one.
"""

from __future__ import annotations

import asyncio

import pytest

from atmosphere.bus import Envelope, Headers, WorkItem, subjects
from atmosphere.bus.errors import BusError
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, RunSubmission, TextDelta, ToolStart
from atmosphere.dispatch.delta_coalescer import CoalescedEvents
from atmosphere.dispatch.resume import DeliveredEvents, same_events
from atmosphere.dispatch.settings import DispatchSettings
from atmosphere.sdk import App, agent
from atmosphere.testing import Turn, wait_until

from .conftest import Harness, kinds, request


class Recorder:
    """An `EventSink` that keeps what it is given, and can be made to fail."""

    def __init__(self) -> None:
        self.events: list[RunEvent] = []
        self.closed = False
        self.fail = False

    async def emit(self, event: RunEvent, *, durable: bool | None = None) -> RunEvent:
        if self.fail:
            raise BusError("the broker is gone")
        self.events.append(event)
        return event

    async def close(self) -> None:
        self.closed = True

    def texts(self) -> list[str]:
        return [e.text_delta.text for e in self.events if e.WhichOneof("kind") == "text_delta"]


def delta(text: str, origin: str = "") -> RunEvent:
    return RunEvent(text_delta=TextDelta(text=text), origin_run_id=origin)


async def test_the_first_delta_goes_out_at_once_and_later_ones_are_joined_within_the_window() -> None:
    sink = Recorder()
    coalesced = CoalescedEvents(sink, window=30)
    for text in ["Hel", "lo", ", ", "wor", "ld"]:
        await coalesced.emit(delta(text))
    assert sink.texts() == ["Hel"]  # the rest is held: the window is still open
    assert coalesced.held == "lo, world"
    await coalesced.emit(RunEvent(tool_start=ToolStart(tool_name="t")))
    # The held text goes out first: no event ever overtakes older text.
    assert sink.texts() == ["Hel", "lo, world"]
    assert kinds(sink.events) == ["text_delta", "text_delta", "tool_start"]
    assert coalesced.held == ""


async def test_held_text_goes_out_when_the_window_ends_without_another_event() -> None:
    sink = Recorder()
    coalesced = CoalescedEvents(sink, window=0.02)
    await coalesced.emit(delta("a"))
    await coalesced.emit(delta("b"))
    await coalesced.emit(delta("c"))
    assert sink.texts() == ["a"]

    async def flushed() -> bool:
        return sink.texts() == ["a", "bc"]

    await wait_until(flushed, timeout=5, what="the window's timer to send the held text")
    # A delta after a quiet spell longer than the window goes out at once again.
    await asyncio.sleep(0.03)
    await coalesced.emit(delta("d"))
    assert sink.texts() == ["a", "bc", "d"]


async def test_max_chars_sends_the_held_text_before_the_window_ends() -> None:
    sink = Recorder()
    coalesced = CoalescedEvents(sink, window=30, max_chars=10)
    for _ in range(12):
        await coalesced.emit(delta("abc"))
    assert sink.texts() == ["abc", "abcabcabcabc", "abcabcabcabc"]
    assert coalesced.held == "abcabcabc"
    await coalesced.close()
    assert sink.texts()[-1] == "abcabcabc"
    assert sink.closed
    assert "".join(sink.texts()) == "abc" * 12


async def test_a_sub_agents_text_and_durable_events_are_never_held() -> None:
    sink = Recorder()
    coalesced = CoalescedEvents(sink, window=30)
    await coalesced.emit(delta("mine"))
    await coalesced.emit(delta(" more"))
    await coalesced.emit(delta("theirs", origin="sub-1"))
    assert [(e.text_delta.text, e.origin_run_id) for e in sink.events] == [
        ("mine", ""),
        (" more", ""),
        ("theirs", "sub-1"),
    ]
    await coalesced.emit(delta("!"), durable=True)
    assert sink.texts()[-1] == "!"


async def test_a_held_text_the_broker_refuses_at_close_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    sink = Recorder()
    coalesced = CoalescedEvents(sink, window=30)
    await coalesced.emit(delta("a"))
    await coalesced.emit(delta("b"))
    sink.fail = True
    await coalesced.close()  # in a `finally`: the re-drive sends what the stream lacks
    assert sink.closed
    assert "could not be written" in caplog.text


def test_the_window_is_configured_in_milliseconds_and_0_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert DispatchSettings().dispatch.text_delta_window_ms == 5
    monkeypatch.setenv("ATMOSPHERE_DISPATCH__TEXT_DELTA_WINDOW_MS", "0")
    monkeypatch.setenv("ATMOSPHERE_DISPATCH__TEXT_DELTA_MAX_CHARS", "64")
    options = DispatchSettings().dispatch
    assert (options.text_delta_window_ms, options.text_delta_max_chars) == (0, 64)
    monkeypatch.setenv("ATMOSPHERE_DISPATCH__TEXT_DELTA_WINDOW_MS", "-1")
    with pytest.raises(ValueError, match="text_delta_window_ms"):
        DispatchSettings()


# -- whole runs ----------------------------------------------------------------------------------


@agent(name="model", system_prompt="Be brief.")
class Model:
    """Answers with the model."""


APP = App(agents=[Model])
ANSWER = " ".join(f"word{i}" for i in range(200)) + "."


def text_of(events: list[RunEvent]) -> str:
    return "".join(e.text_delta.text for e in events if e.WhichOneof("kind") == "text_delta")


async def test_a_fast_models_answer_goes_out_in_far_fewer_events_with_the_same_text(harness: Harness) -> None:
    harness.provider.script(Turn.text(ANSWER))  # every chunk at once: faster than any window
    await harness.executor(APP, text_delta_window=30).execute(request("model", run_id="fast"))
    events = harness.events("fast")
    assert text_of(events) == ANSWER
    assert kinds(events).count("text_delta") < 10  # the fake model sends one chunk per word
    assert [e.seq for e in events] == list(range(2, len(events) + 2))
    assert kinds(events)[-1] == "complete"


async def test_a_slow_models_deltas_each_go_out_at_once(harness: Harness) -> None:
    harness.provider.script(Turn.text("one two three four five", chunk_delay=0.1))
    await harness.executor(APP, text_delta_window=0.005).execute(request("model", run_id="slow"))
    events = harness.events("slow")
    assert [e.text_delta.text for e in events if e.WhichOneof("kind") == "text_delta"] == [
        "one ",
        "two ",
        "three ",
        "four ",
        "five",
    ]


def _work(run: RunSubmission, delivered: int) -> WorkItem[RunSubmission]:
    return WorkItem(Envelope(subjects.run_submit(run.agent), run, Headers()), stream_seq=1, delivered=delivered)


async def test_a_resumed_coalesced_stream_equals_an_uncut_one_character_for_character(harness: Harness) -> None:
    # The uncut run: every delta its own event.
    harness.provider.script(Turn.text(ANSWER))
    await harness.executor(APP, text_delta_window=0).execute(request("model", run_id="uncut"))
    uncut = text_of(harness.events("uncut"))
    assert uncut == ANSWER

    # The coalesced one: joined in windows of 50 ms, its worker killed mid-answer with text held.
    run = request("model", run_id="cut")
    harness.provider.script(Turn.text(ANSWER, chunk_delay=0.005))
    first = harness.executor(APP, durable=True, owner="w1", text_delta_window=0.05)
    task = asyncio.create_task(first.on_work(_work(run, 1)))

    async def half_sent() -> bool:
        return len(text_of(harness.events("cut"))) > len(ANSWER) // 3

    await wait_until(half_sent, timeout=20, what="a third of the answer to be sent")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    before = harness.events("cut")
    assert len(text_of(before)) < len(ANSWER)
    assert kinds(before).count("text_delta") < len(text_of(before).split())  # it was coalesced

    harness.provider.script(Turn.text(ANSWER))  # the round under way is asked again
    await harness.executor(APP, durable=True, owner="w2", text_delta_window=0.05).on_work(_work(run, 2))
    events = harness.events("cut")
    assert text_of(events) == uncut
    assert [e.seq for e in events] == list(range(2, len(events) + 2))
    assert kinds(events).count("complete") == 1


def test_a_redrive_cut_differently_holds_back_exactly_the_coalesced_text_already_sent() -> None:
    # The stream holds the answer's start in two joined deltas; the re-drive sends it a character at a time.
    stored = [
        RunEvent(seq=2, text_delta=TextDelta(text="Paris is")),
        RunEvent(seq=3, text_delta=TextDelta(text=" the capi")),
    ]
    delivered = DeliveredEvents("r1", stored)
    sent = [e for ch in "Paris is the capital of France." for e in delivered.admit(delta(ch))]
    assert "".join(e.text_delta.text for e in sent) == "tal of France."
    assert delivered.held_back == len("Paris is the capi")
    assert not delivered.diverged


def test_replays_compare_a_rounds_text_whole_however_it_was_cut() -> None:
    def stream(*texts: str) -> list[RunEvent]:
        return [RunEvent(seq=2 + i, text_delta=TextDelta(text=t)) for i, t in enumerate(texts)]

    assert same_events(stream("Hel", "lo"), stream("H", "e", "llo"))
    assert not same_events(stream("Hel", "lo"), stream("Hel", "p"))
    tool = RunEvent(seq=4, tool_start=ToolStart(tool_name="t"))
    # Text on either side of another event is not the same text.
    assert not same_events(
        [*stream("a", "b"), tool],
        [
            *stream("a"),
            RunEvent(seq=3, tool_start=ToolStart(tool_name="t")),
            RunEvent(seq=4, text_delta=TextDelta(text="b")),
        ],
    )
