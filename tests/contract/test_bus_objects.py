"""Object buckets, on both backends: data larger than one message is stored and read back whole.

This is how a tool result several times the broker's `max_payload` reaches dispatch: it is put
into `ATMO_TOOL_RESULTS` in chunks that each fit in one message, read back in order, checked
against its digest, and deleted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from atmosphere.bus import (
    Bus,
    BusError,
    ConnectionLostError,
    JetStreamLayout,
    NatsBus,
    ObjectBucketSpec,
    PayloadTooLargeError,
    connect,
    subjects,
)
from atmosphere.bus.sizes import MAX_OBJECT_BYTES
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, TextDelta
from atmosphere.testing.nats_server import NatsServer
from atmosphere.testing.pytest_plugin import delete_namespace_streams

BUCKET = subjects.TOOL_RESULTS_BUCKET
LAYOUT = JetStreamLayout()


@pytest.fixture(params=["fake", "nats"])
def backend(request: pytest.FixtureRequest) -> Bus:
    if request.param == "fake":
        return FakeBus()
    return request.getfixturevalue("nats_bus")  # type: ignore[no-any-return]


@pytest_asyncio.fixture
async def bus(backend: Bus) -> Bus:
    await backend.provision(LAYOUT)
    return backend


def blob(size: int) -> bytes:
    """`size` bytes that are not all alike, so a chunk out of order would show."""
    pattern = bytes(range(256))
    return (pattern * (size // 256 + 1))[:size]


async def still_works(bus: Bus) -> None:
    async with bus.subscribe("objects.ok", RunEvent) as sub:
        await bus.publish("objects.ok", RunEvent(text_delta=TextDelta(text="fine")))
        received = await sub.receive(3.0)
    assert received is not None
    assert bus.is_connected


def test_the_layout_has_the_tool_results_bucket_with_a_max_age() -> None:
    [results] = LAYOUT.object_buckets()
    assert results == ObjectBucketSpec(BUCKET, max_age_seconds=3600, max_bytes=256 << 20)
    assert JetStreamLayout(tool_results_max_age_seconds=60).object_buckets()[0].max_age_seconds == 60


async def test_an_object_several_times_the_broker_limit_comes_back_whole(bus: Bus) -> None:
    data = blob(3 * bus.max_payload + 12_345)
    await bus.object_put(BUCKET, "big", data)
    assert await bus.object_get(BUCKET, "big") == data
    await still_works(bus)


async def test_a_name_put_again_holds_the_latest_and_empty_objects_are_objects(bus: Bus) -> None:
    await bus.object_put(BUCKET, "name", b"first")
    await bus.object_put(BUCKET, "name", b"second")
    assert await bus.object_get(BUCKET, "name") == b"second"
    await bus.object_put(BUCKET, "empty", b"")
    assert await bus.object_get(BUCKET, "empty") == b""


async def test_a_missing_or_deleted_object_is_none_and_deleting_twice_is_fine(bus: Bus) -> None:
    assert await bus.object_get(BUCKET, "never-stored") is None
    await bus.object_put(BUCKET, "once", blob(200_000))
    await bus.object_delete(BUCKET, "once")
    assert await bus.object_get(BUCKET, "once") is None
    await bus.object_delete(BUCKET, "once")
    await bus.object_delete(BUCKET, "never-stored")


async def test_an_object_over_the_maximum_is_refused_before_sending(bus: Bus) -> None:
    with pytest.raises(PayloadTooLargeError) as refused:
        await bus.object_put(BUCKET, "huge", bytes(MAX_OBJECT_BYTES + 1))
    assert (refused.value.size, refused.value.limit) == (MAX_OBJECT_BYTES + 1, MAX_OBJECT_BYTES)
    assert await bus.object_get(BUCKET, "huge") is None
    await still_works(bus)


async def test_a_bucket_that_is_not_provisioned_is_a_bus_error(bus: Bus) -> None:
    with pytest.raises(BusError, match="not provisioned"):
        await bus.object_put("NO_SUCH_BUCKET", "x", b"x")
    with pytest.raises(BusError, match="not provisioned"):
        await bus.object_get("NO_SUCH_BUCKET", "x")
    with pytest.raises(BusError, match="not provisioned"):
        await bus.object_delete("NO_SUCH_BUCKET", "x")


async def test_a_connection_closed_for_good_refuses_to_store(nats_url: str, bus_namespace: str) -> None:
    fake = FakeBus()
    await fake.provision(LAYOUT)
    fake.close_for_good()
    with pytest.raises(ConnectionLostError):
        await fake.object_put(BUCKET, "x", b"x")
    async with connect(nats_url, name="pytest-objects-lost", namespace=bus_namespace) as nats:
        await nats.provision(LAYOUT)
        try:
            await delete_namespace_streams(nats, bus_namespace)
        finally:
            await nats.client.close()
        with pytest.raises(ConnectionLostError):
            await nats.object_put(BUCKET, "x", b"x")


# -- under a lowered broker limit: every chunk must fit ----------------------------------------

LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def limited_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    store = Path(tmp_path_factory.mktemp("objects-nats"))
    config = store / "limits.conf"
    config.write_text(f"max_payload: {LIMIT}\n")
    server = NatsServer(store, extra_args=("-c", str(config))).start()
    try:
        yield server
    finally:
        server.stop()


@pytest_asyncio.fixture
async def limited_bus(limited_nats: NatsServer, bus_namespace: str) -> AsyncIterator[NatsBus]:
    async with connect(limited_nats.url, name="pytest-objects-limited", namespace=bus_namespace) as bus:
        try:
            await bus.provision(LAYOUT)
            yield bus
        finally:
            await delete_namespace_streams(bus, bus_namespace)


async def test_chunks_fit_a_lowered_broker_limit(limited_bus: NatsBus, limited_nats: NatsServer) -> None:
    assert limited_bus.max_payload == LIMIT
    data = blob(16 * LIMIT + 1)  # nats-py's default 128 KiB chunks would each be twice the limit
    await limited_bus.object_put(BUCKET, "big", data)
    assert await limited_bus.object_get(BUCKET, "big") == data
    await still_works(limited_bus)
    log = limited_nats.log_path.read_text(errors="replace")
    assert "maximum payload" not in log.lower()
