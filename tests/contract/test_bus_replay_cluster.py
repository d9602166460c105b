"""Replays on a 3-node cluster: readers on every node read a replicated stream by direct gets.

A follower replica may lag its leader for a moment; a replay reads the newest sequence from the
leader first and goes on until it has it, so a reader on any node sees what was just written.
(On one machine the followers rarely lag long enough to show it; the scripted replica of
`libs/bus/tests/unit/test_direct_reader.py` does.)
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest_asyncio

from atmosphere.bus import JetStreamLayout, NatsBus, Replication, StreamSpec, connect
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, TextDelta
from atmosphere.testing.nats_server import NatsCluster
from atmosphere.testing.pytest_plugin import delete_namespace_streams

LAYOUT = JetStreamLayout(
    replication=Replication(replicas=3), extra_streams=(StreamSpec(name="LOG", subjects=("log.>",)),)
)


@pytest_asyncio.fixture
async def buses(nats_cluster: NatsCluster, bus_namespace: str) -> AsyncIterator[list[NatsBus]]:
    """One bus connected to each node of the cluster."""
    async with contextlib.AsyncExitStack() as stack:
        connected = [
            await stack.enter_async_context(connect(url, name=f"replay-{n}", namespace=bus_namespace))
            for n, url in enumerate(nats_cluster.urls)
        ]
        try:
            yield connected
        finally:
            await delete_namespace_streams(connected[0], bus_namespace)  # the cluster outlives the test


async def test_a_reader_on_any_node_replays_what_was_just_written(buses: list[NatsBus]) -> None:
    writer, *readers = buses
    await writer.provision(LAYOUT)
    written: list[str] = []
    for round_ in range(40):
        for i in range(10):
            written.append(f"{round_}.{i}")
            await writer.publish("log.r1", RunEvent(text_delta=TextDelta(text=written[-1])))
        await writer.js_publish("log.r1", RunEvent(text_delta=TextDelta(text=f"{round_}.end")))
        written.append(f"{round_}.end")
        for reader in readers:  # at once: a follower may not have the newest messages yet
            replayed = [m.text_delta.text async for m in reader.replay("LOG", "log.r1", RunEvent)]
            assert replayed == written, f"round {round_}: a replay on another node stopped short"
    info = await writer.client.jetstream().stream_info(writer.stream_name("LOG"))
    assert info.config.allow_direct
    assert info.state.consumer_count == 0
