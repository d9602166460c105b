"""Replays cost the broker no consumer: any number of readers, long and large subjects, a restart.

nats-server refuses consumers beyond a stream's or account's `max_consumers` (error 10026), so a
replay that made one per reader let a thousand resuming clients stop every other follower.
Replays read by batched direct gets instead; the fake and the real broker answer alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time

import pytest
from nats.js import api as js_api

from atmosphere.bus import Bus, JetStreamLayout, NatsBus, StreamSpec, connect
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, TextDelta
from atmosphere.testing import NatsServer, wait_until

LOG = StreamSpec(name="LOG", subjects=("log.>",))
LAYOUT = JetStreamLayout(extra_streams=(LOG,))


@pytest.fixture(params=["fake", "nats"])
def bus(request: pytest.FixtureRequest) -> Bus:
    if request.param == "fake":
        return FakeBus()
    return request.getfixturevalue("nats_bus")  # type: ignore[no-any-return]


def text(value: str) -> RunEvent:
    return RunEvent(text_delta=TextDelta(text=value))


async def replayed(bus: Bus, subject: str, stream: str = "LOG") -> list[str]:
    return [m.text_delta.text async for m in bus.replay(stream, subject, RunEvent)]


async def test_a_replay_longer_than_a_page_reads_every_message_once_in_order(bus: Bus) -> None:
    await bus.provision(LAYOUT)
    for i in range(1500):
        await bus.publish("log.long" if i % 3 else "log.other", text(str(i)))
    await bus.js_publish("log.long", text("last"))  # stored: so is everything published before it
    assert await replayed(bus, "log.long") == [str(i) for i in range(1500) if i % 3] + ["last"]
    assert await replayed(bus, "log.other") == [str(i) for i in range(0, 1500, 3)]


async def test_messages_as_large_as_the_broker_takes_replay_whole(bus: Bus) -> None:
    await bus.provision(LAYOUT)
    # Each near the broker's limit: a page holds about one of them.
    big = [str(i) * (bus.max_payload - 1024) for i in range(5)]
    for value in big:
        await bus.js_publish("log.big", text(value))
    assert await replayed(bus, "log.big") == big


async def test_other_tasks_run_between_replayed_messages(bus: Bus) -> None:
    """A reader that forwards each message (a socket's writer) keeps pace with a long replay."""
    await bus.provision(LAYOUT)
    for i in range(600):
        await bus.publish("log.paced", text(str(i)))
    await bus.js_publish("log.paced", text("end"))
    turns = 0
    turns_seen: list[int] = []

    async def elsewhere() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    other = asyncio.create_task(elsewhere())
    try:
        async for _ in bus.replay("LOG", "log.paced", RunEvent):
            turns_seen.append(turns)
    finally:
        other.cancel()
    # Between any two messages the other task got a turn: none waited a whole page.
    assert all(later > earlier for earlier, later in itertools.pairwise(turns_seen))


async def consumer_count(bus: NatsBus, stream: str) -> int:
    info = await bus.client.jetstream().stream_info(bus.stream_name(stream))
    return info.state.consumer_count


async def test_a_thousand_two_hundred_replays_at_once_create_no_consumer(nats_bus: NatsBus) -> None:
    await nats_bus.provision(LAYOUT)
    for i in range(20):
        await nats_bus.js_publish("log.run", text(str(i)))
    expected = [str(i) for i in range(20)]
    counts: list[int] = []
    done = asyncio.Event()

    async def watch() -> None:
        while not done.is_set():
            counts.append(await consumer_count(nats_bus, "LOG"))
            await asyncio.sleep(0.01)

    watcher = asyncio.create_task(watch())
    started = time.monotonic()
    results = await asyncio.gather(*(replayed(nats_bus, "log.run") for _ in range(1200)))
    took = time.monotonic() - started
    done.set()
    await watcher
    assert all(r == expected for r in results)
    assert counts, "the consumer count was never sampled"
    assert max(counts) == 0, f"replays created consumers: up to {max(counts)}"
    print(f"1200 replays of 20 events: {took:.2f}s, {took / 1200 * 1000:.2f} ms each; consumers seen: {max(counts)}")


async def test_replays_work_on_a_stream_whose_consumers_are_exhausted(nats_bus: NatsBus) -> None:
    """A stream at its consumer limit (what 1,000 lingering replays reached) is still replayed."""
    js = nats_bus.client.jetstream()
    name = nats_bus.stream_name("CAPPED")
    await js.add_stream(
        js_api.StreamConfig(name=name, subjects=[nats_bus.wire_subject("capped.>")], max_consumers=1, allow_direct=True)
    )
    for i in range(5):
        await nats_bus.js_publish("capped.r1", text(str(i)))
    # The one consumer the stream allows is taken.
    taken = await js.subscribe(nats_bus.wire_subject("capped.>"), stream=name, ordered_consumer=True)
    try:
        results = await asyncio.gather(*(replayed(nats_bus, "capped.r1", "CAPPED") for _ in range(50)))
    finally:
        await taken.unsubscribe()
    assert results == [[str(i) for i in range(5)]] * 50


async def test_a_reader_that_stops_halfway_leaves_nothing_behind(nats_bus: NatsBus) -> None:
    await nats_bus.provision(LAYOUT)
    for i in range(600):
        await nats_bus.publish("log.gone", text(str(i)))
    await nats_bus.js_publish("log.gone", text("end"))
    replay = nats_bus.replay("LOG", "log.gone", RunEvent)
    async with contextlib.aclosing(replay) as reading:
        first = await anext(reading)
    assert first.text_delta.text == "0"
    assert await consumer_count(nats_bus, "LOG") == 0
    assert await replayed(nats_bus, "log.gone") == [*map(str, range(600)), "end"]


async def test_provisioning_turns_direct_gets_on_for_a_stream_made_without_them(nats_bus: NatsBus) -> None:
    """A stream provisioned by an older version (no `allow_direct`) is updated in place."""
    old = StreamSpec(name="LOG", subjects=("log.>",), allow_direct=False)
    await nats_bus.provision(JetStreamLayout(extra_streams=(old,)))
    await nats_bus.js_publish("log.kept", text("kept"))
    js = nats_bus.client.jetstream()
    assert not (await js.stream_info(nats_bus.stream_name("LOG"))).config.allow_direct
    await nats_bus.provision(LAYOUT)
    assert (await js.stream_info(nats_bus.stream_name("LOG"))).config.allow_direct
    assert await replayed(nats_bus, "log.kept") == ["kept"]


async def test_a_replay_goes_on_through_a_broker_restart(fresh_nats: NatsServer) -> None:
    """Killed and started again mid-replay: every message still comes once, in order, or a clear error."""
    async with connect(fresh_nats.url, name="replayer") as bus:
        await bus.provision(LAYOUT)
        for i in range(3000):
            await bus.publish("log.restart", text(str(i)))
        await bus.js_publish("log.restart", text("end"))
        seen: list[str] = []
        replay = bus.replay("LOG", "log.restart", RunEvent)
        async with contextlib.aclosing(replay) as reading:
            async for message in reading:
                seen.append(message.text_delta.text)
                if len(seen) == 300:
                    fresh_nats.kill()
                    await wait_until(lambda: _disconnected(bus), what="the client to notice")
                    fresh_nats.start()
        assert seen == [*map(str, range(3000)), "end"]
        assert bus.epoch >= 1, "the broker was not restarted during the replay"


async def _disconnected(bus: Bus) -> bool:
    return not bus.is_connected
