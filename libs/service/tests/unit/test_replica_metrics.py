"""A replica's lag is what its stream holds past what it applied, read at each look; its applies are counted."""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY

from atmosphere.bus import JetStreamLayout, StreamSpec, WorkItem
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, TextDelta
from atmosphere.service.replica import ReplicaPosition, StreamReplica
from atmosphere.testing import wait_until

STREAM = StreamSpec(name="LAGGING", subjects=("lagging.>",))


def sample(name: str) -> float:
    return REGISTRY.get_sample_value(name, {"store": STREAM.name}) or 0.0


async def test_the_lag_is_what_the_stream_holds_past_the_applied_and_falls_to_zero() -> None:
    bus = FakeBus()
    await bus.provision(JetStreamLayout(extra_streams=(STREAM,)))
    for n in range(3):
        await bus.js_publish("lagging.write", RunEvent(text_delta=TextDelta(text=f"w{n}")))
    gate = asyncio.Event()
    applied: list[str] = []

    async def apply(batch: list[WorkItem[RunEvent]]) -> None:
        await gate.wait()
        applied.extend(item.envelope.message.text_delta.text for item in batch)

    replica = StreamReplica(
        bus,
        stream=STREAM.name,
        filter_subject="lagging.write",
        message_type=RunEvent,
        apply_batch=apply,
        position=ReplicaPosition(None, "lagging"),
        poll_interval=0.05,
    )
    applied_before = sample("atmosphere_replica_applied_total")
    async with replica.applying():

        async def lag_is(expected: float, *, through: int = 0) -> bool:
            return sample("atmosphere_replica_lag") == expected and replica.applied_seq >= through

        # Its first look found three messages; the first apply is held: all three are still ahead.
        await wait_until(lambda: lag_is(3), what="the replica to see three messages ahead")
        gate.set()
        await wait_until(lambda: lag_is(0), what="the replica to catch up")
        await bus.js_publish("lagging.other", RunEvent())  # outside its filter: passed, not applied
        await bus.js_publish("lagging.write", RunEvent(text_delta=TextDelta(text="w3")))
        await wait_until(lambda: lag_is(0, through=5), what="the replica to apply w3")
    assert applied == ["w0", "w1", "w2", "w3"]
    assert sample("atmosphere_replica_applied_total") - applied_before == 4
