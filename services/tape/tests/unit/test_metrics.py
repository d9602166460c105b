"""The tape's series: events recorded from `ATMO_EVENTS` in batches, what it skipped, what the sweep did.

Counters are process-wide: every assertion compares a delta around the action.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from prometheus_client import REGISTRY

from atmosphere.bus import JetStreamLayout, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.run.v1.run_pb2 import Complete, RunEvent, TextDelta
from atmosphere.service.replica import ReplicaPosition, StreamReplica
from atmosphere.tape.handlers import TapeHandlers
from atmosphere.tape.recorder import Recorder
from atmosphere.tape.retention import Bounds, Retention
from atmosphere.tape.store import TapeStore
from atmosphere.tape.sweep import sweep


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def delta(name: str, **labels: str) -> Callable[[], float]:
    """How much the sample moved since this was called."""
    before = sample(name, **labels)
    return lambda: sample(name, **labels) - before


async def test_events_read_from_the_stream_are_counted_once_recorded_with_their_batches(tmp_path: Path) -> None:
    recorded = delta("atmosphere_tape_events_recorded_total")
    skipped = delta("atmosphere_tape_events_skipped_total", reason="unrecordable")
    batches = delta("atmosphere_tape_batch_size_count")
    batched = delta("atmosphere_tape_batch_size_sum")
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    events = [
        RunEvent(run_id="m1", seq=1, agent="echo", text_delta=TextDelta(text="hi")),
        RunEvent(run_id="m1", seq=2, agent="echo", complete=Complete()),
        RunEvent(run_id="m1", seq=0, agent="echo", text_delta=TextDelta(text="no seq")),
    ]
    for event in events:
        await bus.js_publish(subjects.run_events(event.run_id), event)
    async with TapeStore.open(tmp_path / "tape.db") as store:
        handlers = TapeHandlers(store)
        replica = StreamReplica(
            bus,
            stream=subjects.EVENTS_STREAM,
            filter_subject=subjects.run_events_all(),
            message_type=RunEvent,
            apply_batch=handlers.record,
            position=ReplicaPosition(None, "tape"),
            max_batch=10,
            poll_interval=0.05,
        )
        async with replica.applying():
            await replica.caught_up()
        run = await store.run("m1")
    assert run is not None
    assert run.status == "COMPLETED"
    # Every event of a committed batch counts as read; the one the tape cannot place is also skipped.
    assert (recorded(), skipped()) == (3, 1)
    assert (batches(), batched()) == (1, 3)
    assert sample("atmosphere_replica_lag", store=subjects.EVENTS_STREAM) == 0


async def test_the_sweep_counts_the_runs_it_abandons(store: TapeStore) -> None:
    abandoned = delta("atmosphere_tape_runs_swept_total", action="abandoned")
    retention = Retention(Bounds(max_runs=100))
    recorder = Recorder(store, retention=retention, clock=lambda: 1_000_000)
    await recorder.record([RunEvent(run_id="idle", seq=1, agent="echo", text_delta=TextDelta(text="hm"))])
    result = await sweep(store, retention, idle_timeout_ms=30_000, now_ms=1_060_000)
    assert result.abandoned == 1
    assert abandoned() == 1
