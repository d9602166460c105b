"""Following a run: replay, live tail, back-fill, each event once."""

import asyncio

import pytest

from atmosphere.bus import JetStreamLayout, subjects
from atmosphere.bus.runs import StreamGapError, UnknownRunError, follow_run
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.common_pb2 import Error
from atmosphere.contracts.run.v1.run_pb2 import Complete, RunEvent, TextDelta


def text(seq: int, value: str = "x") -> RunEvent:
    return RunEvent(run_id="r1", seq=seq, text_delta=TextDelta(text=value))


def done(seq: int) -> RunEvent:
    return RunEvent(run_id="r1", seq=seq, complete=Complete())


async def bus_with(*events: RunEvent) -> FakeBus:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    for event in events:
        await bus.publish(subjects.run_events("r1"), event)
    return bus


async def collect(bus: FakeBus, **kwargs: int) -> list[int]:
    return [e.seq async for e in follow_run(bus, "r1", **kwargs)]


async def test_a_finished_run_replays_after_the_last_seen_seq_to_its_terminal() -> None:
    bus = await bus_with(text(1), text(2), text(3), done(4))
    assert await collect(bus) == [1, 2, 3, 4]
    assert await collect(bus, after_seq=2) == [3, 4]
    assert await collect(bus, after_seq=4) == []  # nothing after the terminal: nothing to send


async def test_replay_then_live_tail_without_doubles() -> None:
    bus = await bus_with(text(1), text(2))
    seen: list[int] = []

    async def follow() -> None:
        async for event in follow_run(bus, "r1", after_seq=1):
            seen.append(event.seq)

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.05)
    await bus.publish(subjects.run_events("r1"), text(2))  # a duplicate delivery
    await bus.publish(subjects.run_events("r1"), text(3))
    await bus.publish(subjects.run_events("r1"), done(4))
    await asyncio.wait_for(task, 2)
    assert seen == [2, 3, 4]


async def test_a_gap_in_the_live_tail_is_back_filled_from_the_stream() -> None:
    bus = await bus_with(text(1))
    seen: list[int] = []

    async def follow() -> None:
        async for event in follow_run(bus, "r1"):
            seen.append(event.seq)

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.05)
    # Seq 2 and 3 reach the stream but not the live subscription (a reconnect, a slow consumer).
    stream = bus._streams[subjects.EVENTS_STREAM]
    for event in (text(2), text(3)):
        bus._store(stream, subjects.run_events("r1"), event.SerializeToString(), None)
    await bus.publish(subjects.run_events("r1"), done(4))
    await asyncio.wait_for(task, 2)
    assert seen == [1, 2, 3, 4]


async def test_an_unfillable_gap_and_an_unknown_run_are_errors() -> None:
    bus = await bus_with(text(1))
    with pytest.raises(UnknownRunError):
        async for _ in follow_run(bus, "nobody"):
            pass

    async def follow() -> list[int]:
        return [e.seq async for e in follow_run(bus, "r1", gap_patience=0.1)]

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.05)
    await bus.publish(subjects.run_events("r1"), RunEvent(run_id="r1", seq=5, error=Error(message="late")))
    with pytest.raises(StreamGapError, match=r"\[2, 3, 4\]") as gap:
        await asyncio.wait_for(task, 2)
    # What a client is told names the run and what it will never get, and no class name.
    assert (gap.value.run_id, gap.value.missing) == ("r1", [2, 3, 4])
    assert gap.value.plainly == "Run r1 lost events 2, 3, 4 from its stream; it cannot be followed past them"


def test_a_gap_opened_when_the_clock_reads_zero_keeps_its_start(monkeypatch: pytest.MonkeyPatch) -> None:
    # A fresh boot's monotonic clock may read 0.0: that is a time, not "no gap yet".
    from atmosphere.bus import runs

    now = [0.0]
    monkeypatch.setattr(runs.time, "monotonic", lambda: now[0])
    follower = runs._Follower(FakeBus(), "r1", after_seq=0, gap_patience=5.0)
    assert follower.offer(text(2)) == []  # seq 1 is missing: the gap opens at 0.0
    now[0] = 6.0
    assert follower.offer(text(3)) == []
    with pytest.raises(StreamGapError):
        follower._check_gap()  # open since 0.0, longer than the patience
