"""Both backends refuse what the broker would refuse, before sending, and stay connected."""

from __future__ import annotations

import asyncio

import pytest

from atmosphere.bus import (
    Bus,
    ConnectionLostError,
    Headers,
    JetStreamLayout,
    MessageContext,
    PayloadTooLargeError,
    RemoteError,
    Router,
    StreamSpec,
    connect,
)
from atmosphere.bus._codec import wire_size
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, TextDelta

LOG = StreamSpec(name="LOG", subjects=("log.>",))
LAYOUT = JetStreamLayout(extra_streams=(LOG,))
HEADERS = Headers(traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", msg_id="r-1:7")


@pytest.fixture(params=["fake", "nats"])
def bus(request: pytest.FixtureRequest) -> Bus:
    if request.param == "fake":
        return FakeBus()
    return request.getfixturevalue("nats_bus")  # type: ignore[no-any-return]


def sized(bus: Bus, *, over: int, headers: Headers | None = None) -> RunEvent:
    """A message whose wire size (payload + `headers`) is `bus.max_payload + over` bytes."""
    wire = headers.to_wire() if headers else None
    target = bus.max_payload + over - wire_size(b"", wire)
    event = RunEvent(text_delta=TextDelta(text="x" * target))
    # Trim the framing (tags and length prefixes) off the text until the size is exact.
    while event.ByteSize() > target:
        event.text_delta.text = event.text_delta.text[: target - (event.ByteSize() - len(event.text_delta.text))]
    assert event.ByteSize() == target
    return event


async def still_works(bus: Bus) -> None:
    async with bus.subscribe("limits.ok", RunEvent) as sub:
        await bus.publish("limits.ok", RunEvent(text_delta=TextDelta(text="fine")))
        received = await sub.receive(3.0)
    assert received is not None
    assert received.message.text_delta.text == "fine"
    assert bus.is_connected


async def test_max_payload_is_the_servers() -> None:
    assert FakeBus().max_payload == 1 << 20
    assert FakeBus(max_payload=4096).max_payload == 4096


async def test_the_nats_backend_reads_the_limit_from_the_server(nats_bus: Bus) -> None:
    assert nats_bus.max_payload == 1 << 20  # nats-server's default, from its INFO


@pytest.mark.parametrize("headers", [None, HEADERS], ids=["bare", "with-headers"])
async def test_a_message_at_the_limit_goes_one_byte_over_is_refused(bus: Bus, headers: Headers | None) -> None:
    await bus.provision(LAYOUT)
    async with bus.subscribe("limits.edge", RunEvent) as sub:
        await bus.publish("limits.edge", sized(bus, over=0, headers=headers), headers=headers)
        assert await sub.receive(3.0) is not None
    with pytest.raises(PayloadTooLargeError) as refused:
        await bus.publish("limits.edge", sized(bus, over=1, headers=headers), headers=headers)
    assert refused.value.size == bus.max_payload + 1
    assert refused.value.limit == bus.max_payload
    await still_works(bus)


async def test_requests_and_jetstream_publishes_are_refused_too(bus: Bus) -> None:
    await bus.provision(LAYOUT)
    big = sized(bus, over=1)
    with pytest.raises(PayloadTooLargeError):
        await bus.request("limits.nobody", big, RunEvent, timeout=1.0)
    with pytest.raises(PayloadTooLargeError):
        await bus.js_publish("log.big", big)
    with pytest.raises(PayloadTooLargeError):
        await bus.js_publish_nowait("log.big", big)
    await still_works(bus)


async def test_a_reply_too_large_for_the_broker_becomes_an_error_reply(bus: Bus) -> None:
    router = Router()

    async def answer_big(_request: RunEvent, _ctx: MessageContext) -> RunEvent:
        return sized(bus, over=1)

    router.add("limits.big", RunEvent, answer_big)
    async with bus.serve(router):
        with pytest.raises(RemoteError) as refused:
            await bus.request("limits.big", RunEvent(), RunEvent, timeout=3.0)
    assert refused.value.code == "bus.payload_too_large"
    assert refused.value.details["limit"] == str(bus.max_payload)
    await still_works(bus)


async def test_a_publish_without_waiting_resolves_once_stored(bus: Bus) -> None:
    await bus.provision(LAYOUT)
    acks = [await bus.js_publish_nowait("log.a", RunEvent(seq=n), headers=Headers(msg_id=f"a:{n}")) for n in range(5)]
    stored = await asyncio.wait_for(asyncio.gather(*acks), 5.0)
    assert [a.duplicate for a in stored] == [False] * 5
    repeated = await bus.js_publish_nowait("log.a", RunEvent(seq=0), headers=Headers(msg_id="a:0"))
    again = await asyncio.wait_for(repeated, 5)
    assert again.duplicate


async def test_a_fake_closed_for_good_reports_it_and_refuses_sends() -> None:
    bus = FakeBus()
    assert not bus.lost
    bus.close_for_good()
    await assert_lost(bus)


async def test_a_nats_client_closed_for_good_reports_it_and_refuses_sends(nats_url: str, bus_namespace: str) -> None:
    async with connect(nats_url, name="pytest-lost", namespace=bus_namespace) as bus:
        assert not bus.lost
        await bus.client.close()  # what nats-py does by itself after any -ERR from the server
        await assert_lost(bus)


async def assert_lost(bus: Bus) -> None:
    await asyncio.wait_for(bus.wait_lost(), 5.0)
    assert bus.lost
    assert not bus.is_connected
    with pytest.raises(ConnectionLostError):
        await bus.publish("limits.any", RunEvent())
