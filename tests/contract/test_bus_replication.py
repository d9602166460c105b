"""Replication on a real 3-node JetStream cluster: every stream, bucket and durable consumer of the
layout gets the configured replicas; a stream an older version made with one replica is raised
in place; and with three replicas the loss of the node leading the run queue loses no submission.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import pytest_asyncio
from nats.js import api as js_api

from atmosphere.bus import (
    BusError,
    ConsumerSpec,
    Headers,
    JetStreamLayout,
    NatsBus,
    Replication,
    Storage,
    StreamSpec,
    WorkItem,
    connect,
    subjects,
)
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, TextDelta
from atmosphere.testing import wait_until
from atmosphere.testing.nats_server import NatsCluster
from atmosphere.testing.pytest_plugin import delete_namespace_streams

R1 = JetStreamLayout()
R3 = JetStreamLayout(replication=Replication(replicas=3))


@pytest_asyncio.fixture
async def bus(nats_cluster: NatsCluster, bus_namespace: str) -> AsyncIterator[NatsBus]:
    async with connect(nats_cluster.urls, name="replication-test", namespace=bus_namespace) as bus:
        try:
            yield bus
        finally:
            await delete_namespace_streams(bus, bus_namespace)  # the cluster outlives the test


def stream_names(bus: NatsBus, layout: JetStreamLayout) -> list[str]:
    """What JetStream calls every stream of `layout`, buckets included."""
    return [
        *(bus.stream_name(s.name) for s in layout.streams()),
        *(f"KV_{bus.stream_name(b.name)}" for b in layout.buckets()),
        *(f"OBJ_{bus.stream_name(o.name)}" for o in layout.object_buckets()),
    ]


async def replica_counts(bus: NatsBus, names: list[str]) -> dict[str, tuple[int, int]]:
    """Per stream: the configured replicas, and how many servers hold it (leader + followers)."""
    js = bus.client.jetstream()
    counts: dict[str, tuple[int, int]] = {}
    for name in names:
        info = await js.stream_info(name)
        holders = 1 + len(info.cluster.replicas or []) if info.cluster else 0
        counts[name] = (info.config.num_replicas or 1, holders)
    return counts


def text(value: str) -> RunEvent:
    return RunEvent(text_delta=TextDelta(text=value))


def holds(items: list[str], count: int) -> Callable[[], Awaitable[bool]]:
    """A `wait_until` condition: `items` has `count` entries."""

    async def condition() -> bool:
        return len(items) == count

    return condition


async def test_every_stream_and_bucket_of_an_r3_layout_has_three_replicas(bus: NatsBus) -> None:
    await bus.provision(R3)
    names = stream_names(bus, R3)
    assert any(n.startswith("KV_") for n in names)
    assert any(n.startswith("OBJ_") for n in names)
    on_server = {i.config.name for i in await bus.client.jetstream().streams_info()}
    assert {n for n in on_server if n and bus.stream_name("") in n} == set(names)
    assert set((await replica_counts(bus, names)).values()) == {(3, 3)}
    await bus.provision(R3)  # again, as every service does at start: nothing to change, nothing fails
    assert set((await replica_counts(bus, names)).values()) == {(3, 3)}


async def test_a_stream_an_older_version_made_with_one_replica_is_raised_in_place(bus: NatsBus) -> None:
    extra = StreamSpec(name="LOG", subjects=("log.>",))
    await bus.provision(JetStreamLayout(extra_streams=(extra,)))
    for i in range(5):
        await bus.js_publish("log.a", text(str(i)))
    await bus.kv_put(subjects.TOOLS_BUCKET, "calc", text("kept"))
    names = [*stream_names(bus, R1), bus.stream_name("LOG")]
    assert set((await replica_counts(bus, names)).values()) == {(1, 1)}
    spec = ConsumerSpec(stream="LOG", durable="reader", filter_subject="log.>")
    seen: list[str] = []

    async def handler(item: WorkItem[RunEvent]) -> None:
        seen.append(item.envelope.message.text_delta.text)

    async with bus.consume(spec, RunEvent, handler):
        await wait_until(holds(seen, 5), timeout=10, what="the R1 consumer")

    await bus.provision(JetStreamLayout(replication=Replication(replicas=3), extra_streams=(extra,)))

    async def all_raised() -> bool:
        return set((await replica_counts(bus, names)).values()) == {(3, 3)}

    await wait_until(all_raised, timeout=30, interval=0.2, what="every stream at three replicas")
    js = bus.client.jetstream()
    assert (await js.stream_info(bus.stream_name("LOG"))).state.messages == 5  # nothing lost on the way
    assert await bus.kv_get(subjects.TOOLS_BUCKET, "calc", RunEvent) == text("kept")
    # The durable made at R1 is raised with its stream when it is consumed again, its position kept.
    for i in range(5, 7):
        await bus.js_publish("log.a", text(str(i)))
    async with bus.consume(spec, RunEvent, handler):
        await wait_until(holds(seen, 7), timeout=10, what="the raised consumer")
        info = await js.consumer_info(bus.stream_name("LOG"), "reader")
    assert info.config.num_replicas == 3
    assert seen == [str(i) for i in range(7)]


async def test_a_stream_keeps_its_storage_with_a_warning(bus: NatsBus, caplog: pytest.LogCaptureFixture) -> None:
    memory = JetStreamLayout(replication=Replication(replicas=3, storage=Storage.MEMORY))
    await bus.provision(memory)
    await bus.js_publish(subjects.run_events("r1"), text("kept"))
    with caplog.at_level(logging.WARNING, logger="atmosphere.bus"):
        await bus.provision(R3)  # file storage asked for: JetStream cannot change it
    js = bus.client.jetstream()
    events = await js.stream_info(bus.stream_name(subjects.EVENTS_STREAM))
    assert events.config.storage == js_api.StorageType.MEMORY
    assert events.state.messages == 1
    assert any("keeps its memory storage" in r.getMessage() for r in caplog.records)


async def test_a_single_server_refuses_three_replicas_with_a_clear_error(nats_bus: NatsBus) -> None:
    with pytest.raises(BusError, match="replicas > 1 not supported"):
        await nats_bus.provision(R3)


async def test_with_three_replicas_losing_the_run_queue_leader_loses_no_submission(
    bus: NatsBus, nats_cluster: NatsCluster
) -> None:
    await bus.provision(R3)
    js = bus.client.jetstream()
    runs = bus.stream_name(subjects.RUNS_STREAM)
    info = await js.stream_info(runs)
    assert info.cluster is not None
    assert info.cluster.leader is not None
    leader = nats_cluster.index_of(info.cluster.leader)
    subject = subjects.run_submit("echo")
    await bus.js_publish(subject, text("before"), headers=Headers(msg_id="before"))
    spec = ConsumerSpec(stream=subjects.RUNS_STREAM, durable="workers", filter_subject=subjects.run_submit_all())
    seen: list[str] = []

    async def handler(item: WorkItem[RunEvent]) -> None:
        seen.append(item.envelope.message.text_delta.text)

    nats_cluster.kill(leader)
    try:

        async def accepted() -> bool:
            try:
                # The same message id every time: a retry after a lost acknowledgement is no second run.
                await bus.js_publish(subject, text("after"), headers=Headers(msg_id="after"), timeout=2)
            except BusError:
                return False  # no leader yet (elected within seconds)
            return True

        await wait_until(accepted, timeout=30, interval=0.5, what="a submission accepted without the leader")
        async with bus.consume(spec, RunEvent, handler):
            await wait_until(holds(seen, 2), timeout=30, what="both submissions consumed")
        assert sorted(seen) == ["after", "before"]
        info = await js.stream_info(runs)
        assert info.cluster is not None
        assert info.cluster.leader != nats_cluster.names[leader]
    finally:
        nats_cluster.start(leader)


@pytest.mark.timeout(150)
async def test_provisioning_waits_for_a_cluster_that_lost_its_quorum(
    nats_cluster: NatsCluster, bus_namespace: str
) -> None:
    # Connected to the node that stays up: the other two are down while provisioning starts.
    async with connect(nats_cluster.urls[0], name="replication-test", namespace=bus_namespace) as bus:
        nats_cluster.kill(1)
        nats_cluster.kill(2)
        try:
            provisioning = asyncio.create_task(bus.provision(R3))
            await asyncio.sleep(2)
            assert not provisioning.done()  # no meta leader: JetStream does not answer yet
            await asyncio.to_thread(nats_cluster.start, 1)  # a quorum again
            # A quorum, but only two servers for three replicas: provisioning waits for the third
            # ("no suitable peers" is waited out like an election), as it would in a rolling restart.
            await asyncio.to_thread(nats_cluster.start, 2)
            # Every stream and bucket waits out its own election; on a loaded 2-core machine that
            # adds up to tens of seconds, well inside each operation's patience.
            await asyncio.wait_for(provisioning, 100)
        finally:
            if not nats_cluster.running(2):
                await asyncio.to_thread(nats_cluster.start, 2)
        try:
            names = stream_names(bus, R3)
            assert set((await replica_counts(bus, names)).values()) == {(3, 3)}
        finally:
            await delete_namespace_streams(bus, bus_namespace)
