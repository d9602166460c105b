"""`stream_leader` on a real broker: a stream on one server is asked about once per session, on a cluster every time.

Every run's event writer reads the events stream's leader at each confirmation (a leader that
changed makes what was sent to the old one uncertain). On a server without a cluster no other
server can take a stream over, so the answer is kept until the connection session ends; on a
cluster it is read afresh each time. The requests are counted as the client sent them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from atmosphere.bus import JetStreamLayout, NatsBus, Replication, StreamSpec, connect
from atmosphere.testing import NatsServer, wait_until
from atmosphere.testing.nats_server import NatsCluster
from atmosphere.testing.pytest_plugin import delete_namespace_streams

LOG = StreamSpec(name="LOG", subjects=("log.>",))


async def requests_for(bus: NatsBus, calls: int) -> tuple[list[str], int]:
    """`calls` readings of LOG's leader, and how many messages the client sent for them."""
    sent = bus.client.stats["out_msgs"]
    leaders = [await bus.stream_leader("LOG") for _ in range(calls)]
    return leaders, bus.client.stats["out_msgs"] - sent


async def test_a_stream_on_one_server_is_asked_about_once_per_connection_session(fresh_nats: NatsServer) -> None:
    async with connect(fresh_nats.url, name="writer", namespace="leader") as bus:
        await bus.provision(JetStreamLayout(extra_streams=(LOG,)))
        assert await requests_for(bus, 5) == ([""] * 5, 1)
        assert await requests_for(bus, 5) == ([""] * 5, 0)

        # The broker restarted: a new session, which asks again (the server could be a cluster's now).
        fresh_nats.restart()
        await wait_until(lambda: _true(bus.epoch >= 1 and bus.is_connected), timeout=20, what="a reconnect")
        assert await requests_for(bus, 3) == ([""] * 3, 1)


@pytest_asyncio.fixture
async def cluster_bus(nats_cluster: NatsCluster, bus_namespace: str) -> AsyncIterator[NatsBus]:
    async with connect(nats_cluster.urls[0], name="writer", namespace=bus_namespace) as bus:
        try:
            yield bus
        finally:
            await delete_namespace_streams(bus, bus_namespace)  # the cluster outlives the test


async def test_a_replicated_streams_leader_is_read_afresh_every_time(cluster_bus: NatsBus) -> None:
    await cluster_bus.provision(JetStreamLayout(replication=Replication(replicas=3), extra_streams=(LOG,)))
    leaders, sent = await requests_for(cluster_bus, 3)
    assert sent == 3
    assert all(leaders)  # a named leader (and its term)...
    assert len(set(leaders)) == 1  # ...the same each time


async def _true(value: bool) -> bool:
    return value
