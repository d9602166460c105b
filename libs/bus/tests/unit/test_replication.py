"""The layout's replication: one setting for every stream and bucket, checked where it is made."""

from __future__ import annotations

import dataclasses

import pytest

from atmosphere.bus import JetStreamLayout, Replication, Storage, StreamSpec, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, TextDelta

PLACED = Replication(replicas=3, storage=Storage.MEMORY, placement_cluster="east", placement_tags=("ssd",))


def test_every_stream_and_bucket_of_the_layout_gets_its_replication() -> None:
    extra = StreamSpec(name="LOG", subjects=("log.>",))
    layout = JetStreamLayout(replication=PLACED, extra_streams=(extra,))
    specs = [*layout.streams(), *layout.buckets(), *layout.object_buckets()]
    assert {s.name for s in layout.streams()} >= {subjects.RUNS_STREAM, subjects.EVENTS_STREAM, "LOG"}
    assert {spec.replication for spec in specs} == {PLACED}
    # Nothing else about a stream changes with its replication.
    plain = JetStreamLayout(extra_streams=(extra,))
    for replicated, single in zip(layout.streams(), plain.streams(), strict=True):
        assert dataclasses.replace(replicated, replication=Replication()) == single


def test_the_default_is_one_replica_on_file_placed_by_the_server() -> None:
    layout = JetStreamLayout()
    assert {s.replication for s in (*layout.streams(), *layout.buckets(), *layout.object_buckets())} == {
        Replication(replicas=1, storage=Storage.FILE)
    }
    assert not Replication().placed
    assert Replication(placement_tags=("ssd",)).placed
    assert Replication(placement_cluster="east").placed


@pytest.mark.parametrize("replicas", [0, 6, -1])
def test_replicas_outside_what_jetstream_allows_are_refused(replicas: int) -> None:
    with pytest.raises(ValueError, match="between 1 and 5"):
        Replication(replicas=replicas)


async def test_the_fake_bus_provisions_a_replicated_layout() -> None:
    bus = FakeBus()
    await bus.provision(JetStreamLayout(replication=PLACED))
    ack = await bus.js_publish(subjects.run_events("r1"), RunEvent(text_delta=TextDelta(text="x")))
    assert ack.stream == subjects.EVENTS_STREAM
    assert await bus.last_message(subjects.EVENTS_STREAM, subjects.run_events("r1"), RunEvent) is not None
