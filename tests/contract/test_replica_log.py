"""`ReplicaLog` on both backends: N replicas of a stateful service apply one stream and never split.

Each "replica" here is a `ReplicaLog` with its own position and its own store (a list), as two
memory or governance processes have; none holds a consumer on the broker. What a writer gets
back is its own replica's apply; every other replica applies the same messages in the same
order; a read barrier holds until the replica applied everything stored before it; a refused
write is refused on every replica.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from atmosphere.bus import Bus, Headers, JetStreamLayout, NatsBus, PayloadTooLargeError, ServiceError, StreamSpec
from atmosphere.bus.errors import MemoryBadRequestError, ReplicaBehindError
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, TextDelta
from atmosphere.service import replica as replica_module
from atmosphere.service.replica import ReplicaLog, ReplicaPosition, replica_name
from atmosphere.testing import wait_until
from tests.contract.test_bus_limits import sized

STREAM = StreamSpec(name="REPLICATED", subjects=("replicated.>",))
OTHER = "replicated.other"
"""A subject of the same stream that the replicas' filter leaves out (as `ATMO_EVENTS` holds probes)."""
SUBJECT = "replicated.write"
LAYOUT = JetStreamLayout(extra_streams=(STREAM,))


@pytest.fixture(params=["fake", "nats"])
def bus(request: pytest.FixtureRequest) -> Bus:
    if request.param == "fake":
        return FakeBus()
    return request.getfixturevalue("nats_bus")  # type: ignore[no-any-return]


@dataclass
class Replica:
    """One replica's store: the texts it applied, in order; `gate` pauses its applies when cleared."""

    name: str
    volume: Path
    applied: list[str] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    failing: list[int] = field(default_factory=list)
    """While not empty, each apply takes its first element off and fails (this replica's store is failing)."""

    def __post_init__(self) -> None:
        self.gate.set()

    async def apply(self, seq: int, event: RunEvent) -> str:
        await self.gate.wait()
        if self.failing:
            self.failing.pop(0)
            raise OSError(f"disk full at #{seq}")
        if event.text_delta.text.startswith("refuse"):
            raise MemoryBadRequestError(f"refused {event.text_delta.text}")
        self.applied.append(event.text_delta.text)
        return f"{self.name} applied #{seq}"

    def log(self, bus: Bus, barrier_timeout: float = 3.0, poll_interval: float = 1.0) -> ReplicaLog[RunEvent, str]:
        return ReplicaLog(
            bus,
            stream=STREAM.name,
            filter_subject=SUBJECT,
            position=ReplicaPosition(self.volume / self.name, "replicated"),
            message_type=RunEvent,
            apply=self.apply,
            outcomes=(ServiceError,),
            barrier_timeout=barrier_timeout,
            poll_interval=poll_interval,
        )


def write(text: str) -> RunEvent:
    return RunEvent(text_delta=TextDelta(text=text))


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    """Where each replica keeps its position (a directory per name: a restart finds its own)."""
    return tmp_path


@contextlib.asynccontextmanager
async def replicas(
    bus: Bus, volume: Path, *names: str, barrier_timeout: float = 3.0, poll_interval: float = 1.0
) -> AsyncIterator[list[tuple[Replica, ReplicaLog[RunEvent, str]]]]:
    """Replicas `names` applying the stream; a read waits `barrier_timeout` for them to catch up."""
    await bus.provision(LAYOUT)
    pairs = [
        (replica, replica.log(bus, barrier_timeout, poll_interval))
        for replica in (Replica(name, volume) for name in names)
    ]
    async with contextlib.AsyncExitStack() as stack:
        for _, log in pairs:
            await stack.enter_async_context(log.applying())
        yield pairs


async def test_a_writer_gets_its_own_replicas_answer_and_every_replica_applies_the_same(bus: Bus, volume: Path) -> None:
    async with replicas(bus, volume, "a", "b") as [(a, a_log), (b, b_log)]:
        answers = [await (a_log if n % 2 else b_log).write(SUBJECT, write(f"w{n}")) for n in range(6)]
        await b_log.caught_up()
        await a_log.caught_up()
    assert answers == [f"{'a' if n % 2 else 'b'} applied #{n + 1}" for n in range(6)]
    assert a.applied == b.applied == [f"w{n}" for n in range(6)]


async def test_a_refused_write_is_refused_on_every_replica_and_the_writer_sees_the_refusal(
    bus: Bus, volume: Path
) -> None:
    async with replicas(bus, volume, "a", "b") as [(a, a_log), (b, b_log)]:
        with pytest.raises(MemoryBadRequestError, match="refused refuse-me"):
            await a_log.write(SUBJECT, write("refuse-me"))
        assert await a_log.write(SUBJECT, write("kept")) == "a applied #2"
        await b_log.caught_up()
    assert a.applied == b.applied == ["kept"]


async def test_a_read_waits_until_its_replica_applied_every_acknowledged_write(bus: Bus, volume: Path) -> None:
    # The barrier is short here: the refusal is the test, not a wait to sit out.
    async with replicas(bus, volume, "a", "b", barrier_timeout=0.5) as [(_, a_log), (b, b_log)]:
        b.gate.clear()  # b is slow: a's writes are stored and applied by a only
        await a_log.write(SUBJECT, write("first"))
        await a_log.write(SUBJECT, write("second"))
        read = asyncio.create_task(b_log.caught_up())
        await asyncio.sleep(0.2)
        assert not read.done(), "b answered a read before applying what was acknowledged"
        b.gate.set()
        await asyncio.wait_for(read, 5)
        assert b.applied == ["first", "second"]


async def test_a_barrier_is_not_held_by_messages_its_filter_leaves_out(bus: Bus, volume: Path) -> None:
    async with replicas(bus, volume, "a") as [(_, a_log)]:
        await a_log.write(SUBJECT, write("mine"))
        await bus.js_publish(OTHER, write("not mine"))  # the stream's newest message is not the replica's
        await asyncio.wait_for(a_log.caught_up(), 5)


async def test_a_stuck_replica_refuses_a_read_rather_than_answer_without_the_writes(bus: Bus, volume: Path) -> None:
    # The barrier is short here: the refusal is the test, not a wait to sit out.
    async with replicas(bus, volume, "a", "b", barrier_timeout=0.5) as [(_, a_log), (b, b_log)]:
        b.gate.clear()
        await a_log.write(SUBJECT, write("acknowledged"))
        with pytest.raises(ReplicaBehindError) as refused:
            await b_log.caught_up()
        assert refused.value.retryable
        b.gate.set()


async def test_a_new_replica_applies_the_stream_from_its_start(bus: Bus, volume: Path) -> None:
    async with replicas(bus, volume, "a") as [(a, a_log)]:
        for n in range(3):
            await a_log.write(SUBJECT, write(f"w{n}"))
    async with replicas(bus, volume, "late") as [(late, late_log)]:
        await late_log.caught_up()
    assert late.applied == a.applied == ["w0", "w1", "w2"]


async def test_a_replica_restarted_on_its_volume_resumes_where_it_stopped(bus: Bus, volume: Path) -> None:
    async with replicas(bus, volume, "a") as [(first, a_log)]:
        await a_log.write(SUBJECT, write("before"))
    async with replicas(bus, volume, "a") as [(again, again_log)]:
        await again_log.write(SUBJECT, write("after"))
        await again_log.caught_up()
    assert first.applied == ["before"]
    assert again.applied == ["after"], "the same replica must not apply its stream twice"


async def test_a_replica_killed_before_its_position_was_written_applies_those_writes_again(
    bus: Bus, volume: Path
) -> None:
    # The position is written at once after a quiet spell, then at most once a second: a replica
    # killed outright (no flush at its stop) finds an older position and applies again from there.
    position = volume / "a" / "replicated.applied"
    async with replicas(bus, volume, "a") as [(first, a_log)]:
        await a_log.write(SUBJECT, write("w0"))
        at_the_kill = position.read_text()  # w0's: written at once
        await a_log.write(SUBJECT, write("w1"))
        await a_log.write(SUBJECT, write("w2"))
        await a_log.caught_up()
    position.write_text(at_the_kill)  # as the file stood when the process was killed
    async with replicas(bus, volume, "a") as [(again, again_log)]:
        await again_log.caught_up()
    assert first.applied == ["w0", "w1", "w2"]
    assert again.applied == ["w1", "w2"]  # at least once: every store's apply tolerates a repeat


async def test_the_replica_name_is_made_once_and_kept_with_the_data(tmp_path: Path) -> None:
    name = replica_name(tmp_path / "data", "memory")
    assert name.startswith("memory-")
    assert replica_name(tmp_path / "data", "memory") == name
    assert replica_name(tmp_path / "other", "memory") != name


async def test_a_replica_holds_no_consumer_on_the_broker(nats_bus: NatsBus, volume: Path) -> None:
    # A login that may not create consumers (a service's: `bus.permissions`) replicates all the same.
    async with replicas(nats_bus, volume, "a", "b") as [(_, a_log), (b, b_log)]:
        await a_log.write(SUBJECT, write("w"))
        await b_log.caught_up()
        assert b.applied == ["w"]
        info = await nats_bus.client.jetstream().stream_info(nats_bus.stream_name(STREAM.name))
        assert info.state.consumer_count == 0


async def test_the_position_is_kept_beside_the_data_and_survives_a_bad_file(tmp_path: Path) -> None:
    position = ReplicaPosition(tmp_path / "data", "memory")
    assert position.load() == 0
    position.save(42)
    assert ReplicaPosition(tmp_path / "data", "memory").load() == 42
    (tmp_path / "data" / "memory.applied").write_text("garbage")
    assert ReplicaPosition(tmp_path / "data", "memory").load() == 0  # applied again from the start


async def test_a_stream_made_anew_is_applied_from_its_start(bus: Bus, volume: Path) -> None:
    async with replicas(bus, volume, "a") as [(_, a_log)]:
        for n in range(3):
            await a_log.write(SUBJECT, write(f"old{n}"))
    ReplicaPosition(volume / "a", "replicated").save(1000)  # as if it applied a longer, older stream
    async with replicas(bus, volume, "a") as [(again, again_log)]:
        await again_log.caught_up()
    assert again.applied == ["old0", "old1", "old2"]


async def test_a_write_under_a_steady_stream_of_writes_still_passes_the_barrier(bus: Bus, volume: Path) -> None:
    async with replicas(bus, volume, "a", "b") as [(a, a_log), (b, b_log)]:
        stop = asyncio.Event()

        async def keep_writing() -> None:
            n = 0
            while not stop.is_set():
                await a_log.write(SUBJECT, write(f"busy{n}"))
                n += 1

        writer = asyncio.create_task(keep_writing())
        try:
            await wait_until(lambda: _has(b, 5), timeout=10, what="b applying the busy writes")
            for _ in range(5):
                await asyncio.wait_for(b_log.caught_up(), 5)
        finally:
            stop.set()
            await writer
        await b_log.caught_up()
        assert b.applied == a.applied


async def _has(replica: Replica, count: int) -> bool:
    return len(replica.applied) >= count


NEVER = 3600.0
"""A poll interval no test sits out: what is applied was applied on a ring or a write's own word."""


async def test_a_write_is_applied_through_its_acknowledgement_without_asking_where_the_stream_ends(
    bus: Bus, volume: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with replicas(bus, volume, "a", poll_interval=NEVER) as [(a, a_log)]:
        await a_log.write(SUBJECT, write("first"))  # the replica's first look (at its start) is behind
        looks = 0
        stream_last_seq = bus.stream_last_seq

        async def counted(stream: str) -> int:
            nonlocal looks
            looks += 1
            return await stream_last_seq(stream)

        monkeypatch.setattr(bus, "stream_last_seq", counted)
        answers = [await a_log.write(SUBJECT, write(f"w{n}")) for n in range(5)]
        await asyncio.sleep(0.2)  # the doorbell's rings for them came and went
    assert answers == [f"a applied #{n}" for n in range(2, 7)]
    assert a.applied == ["first", *(f"w{n}" for n in range(5))]
    assert looks == 0  # each write's acknowledgement said where to read through; its ring was its own


async def test_writes_on_two_replicas_at_once_reach_both_with_no_poll_and_no_barrier(bus: Bus, volume: Path) -> None:
    # A ring of the other replica's write may be taken for one's own (they are counted, not
    # matched): the own ring it stood for then looks. Nothing may wait for a poll.
    async with replicas(bus, volume, "a", "b", poll_interval=NEVER) as [(a, a_log), (b, b_log)]:
        await asyncio.gather(
            *(log.write(SUBJECT, write(f"{name}{n}")) for n in range(20) for name, log in (("a", a_log), ("b", b_log)))
        )

        async def both_applied_all() -> bool:
            return len(a.applied) == len(b.applied) == 40

        await wait_until(both_applied_all, timeout=10, what="both replicas to apply all 40 writes")
    assert a.applied == b.applied


@contextlib.contextmanager
def counting_reads(bus: Bus, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, int]]]:
    """Each stream read `bus` starts from here on, as (after, through)."""
    reads: list[tuple[int, int]] = []
    read_stream = bus.read_stream

    def counted(*args: Any, after: int, through: int, **kwargs: Any) -> Any:
        reads.append((after, through))
        return read_stream(*args, after=after, through=through, **kwargs)

    monkeypatch.setattr(bus, "read_stream", counted)
    yield reads


async def test_another_writers_write_in_between_is_read_from_the_stream(
    bus: Bus, volume: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with replicas(bus, volume, "a", "b", poll_interval=NEVER) as [(a, a_log), (b, b_log)]:
        for n in range(3):
            await a_log.write(SUBJECT, write(f"w{n}"))
        await b_log.caught_up()
        with counting_reads(bus, monkeypatch) as reads:
            assert await b_log.write(SUBJECT, write("from b")) == "b applied #4"
            # a's own write follows b's: a reads b's from the stream, then applies its own.
            assert await a_log.write(SUBJECT, write("after b")) == "a applied #5"
        assert (3, 4) in reads or any(after == 3 and through >= 4 for after, through in reads)
        await b_log.caught_up()
    assert a.applied == b.applied == ["w0", "w1", "w2", "from b", "after b"]


async def test_a_writer_alone_reads_none_of_its_writes_back(
    bus: Bus, volume: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with replicas(bus, volume, "a", poll_interval=NEVER) as [(a, a_log)]:
        await a_log.write(SUBJECT, write("first"))  # its start's look and read are behind it
        with counting_reads(bus, monkeypatch) as reads:
            for n in range(5):
                await a_log.write(SUBJECT, write(f"w{n}"))
            stored = await a_log.store(SUBJECT, write("stored"))  # not waited for: applied soon after
            await wait_until(lambda: _has(a, 7), timeout=5, what="the stored write to be applied")
            await asyncio.sleep(0.2)  # the doorbell's rings for them came and went
        assert reads == []
    assert stored.seq == 7
    assert a.applied == ["first", *(f"w{n}" for n in range(5)), "stored"]


async def test_a_repeated_write_is_applied_once_and_answered_with_the_first_answer(bus: Bus, volume: Path) -> None:
    async with replicas(bus, volume, "a", "b") as [(a, a_log), (b, b_log)]:
        first = await a_log.write(SUBJECT, write("once"), msg_id="k1")
        again = await a_log.write(SUBJECT, write("twice?"), msg_id="k1")  # a retry: the stream keeps the first
        await b_log.caught_up()
    assert first == again == "a applied #1"
    assert a.applied == b.applied == ["once"]


async def test_an_own_write_whose_apply_failed_is_read_from_the_stream_and_applied(
    bus: Bus, volume: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replica_module, "RETRY_DELAY", 0.01)
    async with replicas(bus, volume, "a", poll_interval=NEVER) as [(a, a_log)]:
        await a_log.write(SUBJECT, write("first"))
        a.failing.append(2)  # an error, not an answer: applied again
        with counting_reads(bus, monkeypatch) as reads:
            assert await a_log.write(SUBJECT, write("second")) == "a applied #2"
        assert a.failing == []
        assert reads, "after the failed apply the write is read from the stream"
    assert a.applied == ["first", "second"]


async def test_the_largest_write_is_applied_as_written_and_one_byte_more_leaves_the_rings_counted_right(
    bus: Bus, volume: Path
) -> None:
    async with replicas(bus, volume, "a", "b", poll_interval=NEVER) as [(a, a_log), (b, b_log)]:
        largest = sized(bus, over=0, headers=Headers(msg_id="big"))  # the broker's limit, exactly
        assert await a_log.write(SUBJECT, largest, msg_id="big") == "a applied #1"
        with pytest.raises(PayloadTooLargeError):
            await a_log.write(SUBJECT, write(largest.text_delta.text + "x"), msg_id="big+1")
        assert await a_log.write(SUBJECT, write("after")) == "a applied #2"
        # The refused write's ring was never counted on: b's next write rings a as another's, and
        # a reads it at once (no poll comes).
        assert await b_log.write(SUBJECT, write("from b")) == "b applied #3"
        await wait_until(lambda: _has(a, 3), timeout=5, what="a to hear of b's write")
    assert a.applied == b.applied == [largest.text_delta.text, "after", "from b"]
