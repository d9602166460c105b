"""A run's events reach the stream exactly once, whatever happens to their acknowledgements."""

from __future__ import annotations

import asyncio

import pytest
from google.protobuf.message import Message

from atmosphere.bus import BusError, Headers, JetStreamLayout, PayloadTooLargeError, PublishAck, runs, subjects
from atmosphere.bus import _run_writer as runs_writer
from atmosphere.bus.runs import RunEventWriter, follow_run, submit_run
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.run.v1.run_pb2 import (
    ApprovalRequired,
    Complete,
    Progress,
    RunEvent,
    RunSubmission,
    TextDelta,
    ToolCallDelta,
)
from atmosphere.testing import wait_until


class FlakyBroker(FakeBus):
    """Loses the first copy of chosen events with the connection session they went out on.

    The broker restarts with them in flight: they are never stored, and the session ends (the
    epoch moves), as a real client notices a dead connection.
    """

    def __init__(self, *, lose: set[int] = frozenset(), **kwargs: int) -> None:
        super().__init__(**kwargs)
        self.lose = set(lose)
        self.sends: list[int] = []
        self.probes = 0

    async def publish(self, subject: str, message: Message, *, headers: Headers | None = None) -> None:
        seq = message.seq if isinstance(message, RunEvent) else 0
        self.sends.append(seq)
        if seq in self.lose:
            self.lose.discard(seq)
            self.disconnect()
            return
        await super().publish(subject, message, headers=headers)

    async def js_publish(
        self, subject: str, message: Message, *, headers: Headers | None = None, timeout: float = 5.0
    ) -> PublishAck:
        if subject.endswith(".probe"):
            self.probes += 1
        else:
            self.sends.append(message.seq if isinstance(message, RunEvent) else 0)
        return await super().js_publish(subject, message, headers=headers, timeout=timeout)


def request(run_id: str = "r1", user: str = "alice") -> RunSubmission:
    return RunSubmission(run_id=run_id, agent="echo", principal=Principal(user_id=user))


def stored_seqs(bus: FakeBus, run_id: str = "r1") -> list[int]:
    return [
        RunEvent.FromString(data).seq
        for subject, data in bus.stream_messages(subjects.EVENTS_STREAM)
        if subject == subjects.run_events(run_id)
    ]


def text(n: int) -> RunEvent:
    return RunEvent(text_delta=TextDelta(text=f"t{n}"))


def progress(n: int) -> RunEvent:
    return RunEvent(progress=Progress(message=f"p{n}"))


async def write(writer: RunEventWriter, events: list[RunEvent]) -> None:
    for event in events:
        await writer.emit(event)
    await writer.emit(RunEvent(complete=Complete()))
    await writer.close()


MIXED = [text(0), text(1), progress(2), text(3), progress(4)]
"""Seqs 2-6: stream pieces and other events."""


@pytest.mark.parametrize(
    "lose", [{3}, {2, 3, 5}, {4}, {3, 4, 6}, {2, 3, 4, 5, 6}], ids=["one", "several", "other-kind", "mixed", "all"]
)
async def test_every_event_is_stored_exactly_once(lose: set[int]) -> None:
    bus = FlakyBroker(lose=lose)
    await bus.provision(JetStreamLayout())
    writer = RunEventWriter(bus, request(), ack_patience=0.05)
    await write(writer, MIXED)
    assert sorted(stored_seqs(bus)) == list(range(2, 8))  # five events and the terminal, each once
    assert writer.unacknowledged == 0
    for seq in lose:
        assert bus.sends.count(seq) == 2  # sent again, with its message id


async def test_pieces_of_an_unbroken_session_are_confirmed_without_a_probe() -> None:
    bus = FlakyBroker()
    await bus.provision(JetStreamLayout())
    await write(RunEventWriter(bus, request(), ack_patience=0.05), [text(n) for n in range(50)])
    assert bus.probes == 0  # the terminal's own acknowledgement proved them
    assert bus.sends.count(10) == 1


async def test_a_resent_event_may_be_stored_late_but_followers_read_it_in_order() -> None:
    bus = FlakyBroker(lose={3})
    await bus.provision(JetStreamLayout())
    await write(RunEventWriter(bus, request(), ack_patience=0.05), [text(0), text(1), text(2)])
    assert stored_seqs(bus) == [2, 4, 5, 3]
    assert [e.seq async for e in follow_run(bus, "r1", after_seq=1)] == [2, 3, 4, 5]


async def test_a_lost_event_before_a_quiet_spell_is_sent_again_while_the_run_waits() -> None:
    bus = FlakyBroker(lose={2, 3})
    await bus.provision(JetStreamLayout())
    writer = RunEventWriter(bus, request(), ack_patience=0.05)
    await writer.emit(text(0))  # a piece lost with its session
    approval = RunEvent(approval_required=ApprovalRequired(approval_id="apr_000000000001", tool_name="rm"))
    await writer.emit(approval)  # lost too; then the run waits for a human, emitting nothing
    await wait_until(lambda: _stored(bus, {2, 3}), timeout=3, what="the watchdog to send them again")
    await writer.close()


async def test_pieces_sent_while_disconnected_are_sent_once_connected_again() -> None:
    bus = FlakyBroker()
    await bus.provision(JetStreamLayout())
    writer = RunEventWriter(bus, request(), ack_patience=0.05)
    bus.connected = False
    await writer.emit(text(0))
    await writer.emit(text(1))
    assert stored_seqs(bus) == []
    bus.disconnect()
    bus.connected = True
    await wait_until(lambda: _stored(bus, {2, 3}), timeout=3, what="the pieces to be sent once back")
    await writer.close()


async def _stored(bus: FakeBus, seqs: set[int]) -> bool:
    return set(stored_seqs(bus)) >= seqs


async def test_every_event_names_the_runs_owner() -> None:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    await write(RunEventWriter(bus, request(user="bob")), [text(0), progress(1)])
    owners = {RunEvent.FromString(data).owner for _, data in bus.stream_messages(subjects.EVENTS_STREAM)}
    assert owners == {"bob"}


async def test_an_event_that_cannot_be_stored_in_time_fails_the_flush() -> None:
    bus = FlakyBroker(lose={2})
    await bus.provision(JetStreamLayout())
    writer = RunEventWriter(bus, request(), ack_patience=0.05, store_deadline=0.2)
    await writer.emit(progress(0))  # lost with its session

    async def never_stores(
        subject: str, message: Message, *, headers: Headers | None = None, timeout: float = 5.0
    ) -> PublishAck:
        raise BusError("nats: timeout")

    bus.js_publish = never_stores  # type: ignore[method-assign]  # and the broker does not come back
    with pytest.raises(BusError, match="not stored"):
        await writer.flush()
    await writer.close()


async def test_an_event_too_large_for_the_broker_is_refused_without_using_a_seq() -> None:
    bus = FakeBus(max_payload=512)
    await bus.provision(JetStreamLayout())
    writer = RunEventWriter(bus, request())
    with pytest.raises(PayloadTooLargeError):
        await writer.emit(RunEvent(progress=Progress(message="x" * 600)))
    await writer.emit(RunEvent(complete=Complete()))
    assert stored_seqs(bus) == [2]


async def test_a_submission_without_a_connection_is_refused_at_once() -> None:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    bus.connected = False
    with pytest.raises(runs.SubmitError, match="unreachable"):
        await submit_run(bus, request())
    assert stored_seqs(bus) == []


class RunsQueueBroker(FakeBus):
    """Records the order in which messages reach the broker; may refuse to queue runs."""

    def __init__(self, *, refuse_runs: bool = False) -> None:
        super().__init__()
        self.refuse_runs = refuse_runs
        self.order: list[str] = []
        self.leader_reads = 0

    async def js_publish(
        self, subject: str, message: Message, *, headers: Headers | None = None, timeout: float = 5.0
    ) -> PublishAck:
        if subject.startswith("atmo.submit."):
            self.order.append("submission")
            if self.refuse_runs:
                raise BusError("no acknowledgement")
        elif isinstance(message, RunEvent):
            self.order.append(f"event {message.seq}")
        return await super().js_publish(subject, message, headers=headers, timeout=timeout)

    async def stream_leader(self, stream: str) -> str:
        self.leader_reads += 1
        return await super().stream_leader(stream)


async def test_the_run_id_event_is_stored_before_the_run_is_queued() -> None:
    # A worker can write seq 2 only after it pulled the run: seq 1 must be in the stream by then,
    # so a plain subscriber of `ATMO_EVENTS` reads every run's events in seq order.
    bus = RunsQueueBroker()
    await bus.provision(JetStreamLayout())
    await submit_run(bus, request())
    assert bus.order == ["event 1", "submission"]
    assert stored_seqs(bus) == [1]
    # A durable event proves itself: no stream-info round trip for the submitter's one event.
    assert bus.leader_reads == 0


async def test_a_run_that_cannot_be_queued_ends_for_whoever_learnt_its_id() -> None:
    bus = RunsQueueBroker(refuse_runs=True)
    await bus.provision(JetStreamLayout())
    with pytest.raises(runs.SubmitError, match="not submitted"):
        await submit_run(bus, request(), deadline=0.2)
    events = [RunEvent.FromString(data) for _, data in bus.stream_messages(subjects.EVENTS_STREAM)]
    assert [e.seq for e in events] == [1, 2]
    assert events[1].error.code == "run.not_queued"
    assert events[1].error.retryable
    # A client resuming by the run id sees the run end instead of waiting for ever.
    assert [e.seq async for e in follow_run(bus, "r1")] == [1, 2]


async def test_a_quiet_follower_finds_events_it_never_saw_live(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runs, "IDLE_CHECK", 0.05)
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    stream = bus._streams[subjects.EVENTS_STREAM]

    async def follow() -> list[int]:
        return [e.seq async for e in follow_run(bus, "r1")]

    await bus.publish(subjects.run_events("r1"), RunEvent(run_id="r1", seq=1))
    task = asyncio.create_task(follow())
    await asyncio.sleep(0.05)
    # Stored while this follower's connection was down: no live copy ever arrives.
    for event in (RunEvent(run_id="r1", seq=2), RunEvent(run_id="r1", seq=3, complete=Complete())):
        bus._store(stream, subjects.run_events("r1"), event.SerializeToString(), None)
    assert await asyncio.wait_for(task, 3) == [1, 2, 3]


async def test_live_events_out_of_order_are_put_back_in_order() -> None:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    await bus.publish(subjects.run_events("r1"), RunEvent(run_id="r1", seq=1))

    async def follow() -> list[int]:
        return [e.seq async for e in follow_run(bus, "r1")]

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.05)
    for seq in (3, 2):
        await bus.publish(subjects.run_events("r1"), RunEvent(run_id="r1", seq=seq))
    await bus.publish(subjects.run_events("r1"), RunEvent(run_id="r1", seq=4, complete=Complete()))
    assert await asyncio.wait_for(task, 3) == [1, 2, 3, 4]


@pytest.mark.parametrize("kind", ["text_delta", "tool_call_delta"])
async def test_a_streamed_piece_too_big_for_one_message_goes_as_several(kind: str) -> None:
    bus = FakeBus(max_payload=4096)
    await bus.provision(JetStreamLayout())
    writer = RunEventWriter(bus, request())
    text = "é" * 3000 + "x" * 5000  # 11,000 bytes, multi-byte characters at the cuts
    if kind == "text_delta":
        await writer.emit(RunEvent(text_delta=TextDelta(text=text)))
    else:
        await writer.emit(RunEvent(tool_call_delta=ToolCallDelta(call_id="c1", arguments_fragment=text)))
    await writer.emit(RunEvent(complete=Complete()))
    events = [RunEvent.FromString(data) for _, data in bus.stream_messages(subjects.EVENTS_STREAM)]
    pieces = [e for e in events if e.WhichOneof("kind") == kind]
    assert len(pieces) >= 3
    joined = "".join(
        e.text_delta.text if kind == "text_delta" else e.tool_call_delta.arguments_fragment for e in pieces
    )
    assert joined == text
    assert [e.seq for e in events] == list(range(2, 2 + len(events)))


async def test_a_run_request_too_big_to_queue_leaves_nothing_behind() -> None:
    bus = FakeBus(max_payload=4096)
    await bus.provision(JetStreamLayout())
    big = request()
    big.message = "x" * 5000
    with pytest.raises(PayloadTooLargeError):
        await submit_run(bus, big)
    assert bus.stream_messages(subjects.EVENTS_STREAM) == []


async def test_a_resume_after_the_end_of_a_live_run_ends_with_the_run() -> None:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    await bus.publish(subjects.run_events("r1"), RunEvent(run_id="r1", seq=1))

    async def follow() -> list[int]:
        return [e.seq async for e in follow_run(bus, "r1", after_seq=999_999)]

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.05)
    await bus.publish(subjects.run_events("r1"), RunEvent(run_id="r1", seq=2, complete=Complete()))
    assert await asyncio.wait_for(task, 3) == []  # nothing past the seq asked for, and done


async def test_garbage_on_a_runs_subject_does_not_make_the_run_unreadable() -> None:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    stream = bus._streams[subjects.EVENTS_STREAM]
    await bus.publish(subjects.run_events("r1"), RunEvent(run_id="r1", seq=1))
    bus._store(stream, subjects.run_events("r1"), b"\xff\xfe not a protobuf", None)
    await bus.publish(subjects.run_events("r1"), RunEvent(run_id="r1", seq=2, complete=Complete()))
    bus._store(stream, subjects.run_events("r1"), b"\xff\xfe garbage after the end", None)
    assert [e.seq async for e in follow_run(bus, "r1")] == [1, 2]
    last = await runs.last_event(bus, "r1")
    assert last is not None
    assert last.seq == 2


class FailingOverCluster(FakeBus):
    """A cluster whose `ATMO_EVENTS` leader dies with chosen events in flight, this connection intact.

    The live subscribers got them (core delivery), the stream never stored them, and the
    epoch does not move: only the leader (and its term) says that something may be lost.
    """

    def __init__(self, *, lose: set[int]) -> None:
        super().__init__()
        self.lose = set(lose)
        self.leader = "n0@t1"
        self.sends: list[int] = []

    async def publish(self, subject: str, message: Message, *, headers: Headers | None = None) -> None:
        seq = message.seq if isinstance(message, RunEvent) else 0
        self.sends.append(seq)
        if seq in self.lose:
            self.lose.discard(seq)
            self._deliver(subject, message.SerializeToString(), None, None)  # seen live, never stored
            self.leader = "n1@t2"  # the leader died with it; another took over
            return
        await super().publish(subject, message, headers=headers)

    async def js_publish(
        self, subject: str, message: Message, *, headers: Headers | None = None, timeout: float = 5.0
    ) -> PublishAck:
        if not subject.endswith(".probe"):
            self.sends.append(message.seq if isinstance(message, RunEvent) else 0)
        return await super().js_publish(subject, message, headers=headers, timeout=timeout)

    async def stream_leader(self, stream: str) -> str:
        await super().stream_leader(stream)
        return self.leader


@pytest.mark.parametrize("lose", [{3}, {2, 5}, {6}], ids=["one", "two", "last-before-terminal"])
async def test_events_lost_with_a_stream_leader_are_sent_again_though_the_connection_lived(lose: set[int]) -> None:
    bus = FailingOverCluster(lose=lose)
    await bus.provision(JetStreamLayout())
    writer = RunEventWriter(bus, request(), ack_patience=0.05)
    await write(writer, MIXED)
    assert sorted(stored_seqs(bus)) == list(range(2, 8))  # nothing missing, nothing twice
    assert writer.unacknowledged == 0
    for seq in lose:
        assert bus.sends.count(seq) == 2


async def test_under_one_leader_the_terminal_still_proves_the_events_before_it() -> None:
    bus = FailingOverCluster(lose=set())
    await bus.provision(JetStreamLayout())
    writer = RunEventWriter(bus, request(), ack_patience=0.05)
    await write(writer, [text(n) for n in range(20)])
    assert sorted(stored_seqs(bus)) == list(range(2, 23))
    assert all(bus.sends.count(seq) == 1 for seq in range(2, 22))


async def test_events_lost_with_a_leader_are_stored_again_while_the_run_still_streams(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runs_writer, "CONFIRM_AFTER", 0.1)
    bus = FailingOverCluster(lose={3})
    await bus.provision(JetStreamLayout())
    writer = RunEventWriter(bus, request(), ack_patience=0.05)
    for n in range(4):
        await writer.emit(text(n))

    async def repaired() -> bool:
        return sorted(stored_seqs(bus)) == [2, 3, 4, 5]

    # No terminal event, no disconnect: only the watchdog's periodic confirmation can find it.
    await wait_until(repaired, timeout=5, what="the lost event stored again before the run ends")
    await writer.emit(RunEvent(complete=Complete()))
    await writer.close()
    assert sorted(stored_seqs(bus)) == [2, 3, 4, 5, 6]


class FrozenLeader(FakeBus):
    """A cluster whose `ATMO_EVENTS` leader freezes: what is sent to it is lost, probes hang until
    another node leads (`elect`), then JetStream stores again, under the new leader."""

    def __init__(self) -> None:
        super().__init__()
        self.leader = "n1@t1"
        self.frozen = False
        self.elected = asyncio.Event()

    def freeze(self) -> None:
        self.frozen = True
        self.elected.clear()

    def elect(self) -> None:
        self.leader, self.frozen = "n2@t2", False
        self.elected.set()

    async def publish(self, subject: str, message: Message, *, headers: Headers | None = None) -> None:
        if self.frozen:
            self._deliver(subject, message.SerializeToString(), None, None)  # seen live, never stored
            return
        await super().publish(subject, message, headers=headers)

    async def js_publish(
        self, subject: str, message: Message, *, headers: Headers | None = None, timeout: float = 5.0
    ) -> PublishAck:
        if self.frozen:
            await self.elected.wait()  # no leader answers until one is elected
        return await super().js_publish(subject, message, headers=headers, timeout=timeout)

    async def stream_leader(self, stream: str) -> str:
        await super().stream_leader(stream)
        return self.leader


async def test_a_confirmation_under_way_when_the_leader_changes_proves_nothing_it_did_not_see(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The watchdog's probe hangs on the frozen leader; the run ends meanwhile and its terminal
    # event, stored by the new leader, reads the leader again. The watchdog's own probe must then
    # still count its pieces (sent to the frozen one) as unproven: the writer once compared them
    # with the leader the terminal had just read, and lost every event of the freeze.
    monkeypatch.setattr(runs_writer, "CONFIRM_AFTER", 0.05)
    bus = FrozenLeader()
    await bus.provision(JetStreamLayout())
    writer = RunEventWriter(bus, request(), ack_patience=0.05)
    await writer.emit(text(0))  # seq 2, stored by n1
    bus.freeze()
    for n in range(1, 6):
        await writer.emit(text(n))  # seqs 3-7: lost with the frozen leader
    await asyncio.sleep(0.3)  # the watchdog's probe is now waiting for a leader
    terminal = asyncio.create_task(writer.emit(RunEvent(complete=Complete())))
    await asyncio.sleep(0.05)
    bus.elect()
    await asyncio.wait_for(terminal, 5)
    await writer.close()
    assert sorted(stored_seqs(bus)) == list(range(2, 9))  # seq 8 is the terminal; nothing lost
