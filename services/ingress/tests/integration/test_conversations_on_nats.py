"""Two ingress replicas' conversation trackers on a real nats-server: one announcement per stretch.

Each replica has a connection of its own; they share `ATMO_CONVERSATIONS` (real JetStream KV,
real compare-and-set) and a clock the test moves. A third connection listens on
`atmo.conv.closed`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator

from atmosphere.bus import JetStreamLayout, NatsBus, Subscription, connect, subjects
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.memory.v1.memory_pb2 import ConversationClosed
from atmosphere.ingress.conversations import ConversationTracker

ADA = Principal(user_id="ada", auth_method="bearer")
IDLE = 60.0
GRACE = 10.0
SENTINEL = "sentinel"


class Clock:
    """Epoch seconds under the test's control, shared by the replicas."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def replicas(
    nats_url: str, namespace: str, clock: Clock
) -> AsyncIterator[list[tuple[NatsBus, ConversationTracker]]]:
    """Two replicas, each a connection and a tracker."""
    async with (
        connect(nats_url, name="ingress-a", namespace=namespace) as bus_a,
        connect(nats_url, name="ingress-b", namespace=namespace) as bus_b,
    ):
        yield [
            (bus, ConversationTracker(bus, idle_timeout=IDLE, instance=name, clock=clock, grace=GRACE))
            for bus, name in ((bus_a, "ingress-a"), (bus_b, "ingress-b"))
        ]


async def announcements(
    closed: Subscription[ConversationClosed], pairs: list[tuple[NatsBus, ConversationTracker]]
) -> Counter[tuple[str, str]]:
    """Every announcement since the last call, counted by (conversation, reason).

    Each replica then publishes a sentinel on its own connection: NATS keeps one connection's
    order, so once both sentinels arrived, everything the replicas announced before has too.
    """
    for _ in range(10):  # announcements are published by tasks of their own
        await asyncio.sleep(0)
    for bus, _ in pairs:
        await bus.publish(subjects.conversation_closed(), ConversationClosed(conversation_id=SENTINEL))
    seen: Counter[tuple[str, str]] = Counter()
    sentinels = 0
    async with asyncio.timeout(10):
        async for envelope in closed:
            if envelope.message.conversation_id == SENTINEL:
                sentinels += 1
                if sentinels == len(pairs):
                    return seen
            else:
                seen[envelope.message.conversation_id, envelope.message.reason] += 1
    return seen


async def test_alternating_prompts_and_racing_sweeps_announce_each_conversation_once(
    nats_bus: NatsBus, nats_url: str, bus_namespace: str
) -> None:
    await nats_bus.provision(JetStreamLayout())
    clock = Clock()
    names = [f"c{i}" for i in range(20)]
    async with (
        replicas(nats_url, bus_namespace, clock) as pairs,
        nats_bus.subscribe(subjects.conversation_closed(), ConversationClosed) as closed,
    ):
        (_, a), (_, b) = pairs
        for turn in range(4):
            r = (a, b)[turn % 2]
            for name in names:
                r.touch("chat", name, ADA)
            await r.flush()
            clock.now += 10
        clock.now += IDLE - 10 - 1
        assert await a.sweep() + await b.sweep() == 0
        # Past the owner's idle and the other's grace: both may end every stretch, and both
        # try at once, so their compare-and-sets on the real bucket race.
        clock.now += GRACE + 2
        counts = await asyncio.gather(a.sweep(), b.sweep())
        assert sum(counts) == len(names)
        clock.now += 5 * IDLE
        assert await a.sweep() + await b.sweep() == 0
        assert await announcements(closed, pairs) == Counter({(name, "idle"): 1 for name in names})
        assert len(a) == len(b) == 0


async def test_a_socket_on_one_replica_then_its_stop_the_other_ends_it_once(
    nats_bus: NatsBus, nats_url: str, bus_namespace: str
) -> None:
    await nats_bus.provision(JetStreamLayout())
    clock = Clock()
    async with (
        replicas(nats_url, bus_namespace, clock) as pairs,
        nats_bus.subscribe(subjects.conversation_closed(), ConversationClosed) as closed,
    ):
        (_, a), (_, b) = pairs
        a.socket_opened("chat", "held", ADA)
        a.socket_opened("chat", "left", ADA)
        await a.flush()
        b.touch("chat", "held", ADA)
        b.touch("chat", "left", ADA)
        await b.flush()
        for _ in range(int(3 * IDLE / 5)):  # both sweep every 5 s for three idle timeouts
            clock.now += 5
            await a.sweep()
            await b.sweep()
        assert await announcements(closed, pairs) == Counter()
        a.socket_closed("chat", "left")
        await a.flush()
        assert await announcements(closed, pairs) == Counter({("left", "disconnect"): 1})
        # a stops (no refresh, no departure): b ends "held" once the record is stale, not before.
        stopped = clock.now
        while clock.now - stopped < IDLE + GRACE - 10:
            clock.now += 5
            await b.sweep()
        assert await announcements(closed, pairs) == Counter()
        while clock.now - stopped < IDLE + GRACE + 10:
            clock.now += 5
            await b.sweep()
        clock.now += 5 * IDLE
        await b.sweep()
        assert await announcements(closed, pairs) == Counter({("held", "idle"): 1})
