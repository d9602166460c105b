"""Two ingress replicas on one bus: each conversation's end is announced once, by the right one.

Each `ConversationTracker` is one replica (its own instance name); both share the bucket
`ATMO_CONVERSATIONS` of one `FakeBus` and one clock the test moves. `sweep()` and `flush()` are
what each replica's sweeper runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from google.protobuf.message import Message

from atmosphere.bus import JetStreamLayout, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.memory.v1.memory_pb2 import ConversationClosed
from atmosphere.ingress.conversations import DEBOUNCE, ConversationTracker

ADA = Principal(user_id="ada", auth_method="bearer")
IDLE = 60.0
GRACE = 10.0
STEP = 5.0
"""How often the test runs each replica's sweep (a replica's sweeper runs more often than it refreshes)."""


class Clock:
    """Epoch seconds under the test's control, shared by the replicas."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


class CountingBus(FakeBus):
    """A `FakeBus` that counts the record writes that changed something, per key."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    async def kv_update(  # type: ignore[override]
        self, bucket: str, key: str, message_type: type[Message], change: Callable[[Message | None], Message | None]
    ) -> Message | None:
        def counted(current: Message | None) -> Message | None:
            new = change(current)
            if new is not current:
                self.writes += 1
            return new

        return await super().kv_update(bucket, key, message_type, counted)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def bus() -> CountingBus:
    fake = CountingBus()
    await fake.provision(JetStreamLayout())
    return fake


def replica(bus: FakeBus, clock: Clock, name: str) -> ConversationTracker:
    return ConversationTracker(bus, idle_timeout=IDLE, instance=f"ingress-{name}", clock=clock, grace=GRACE)


async def announced(bus: FakeBus) -> list[str]:
    """The reason of every `ConversationClosed` published so far."""
    for _ in range(5):  # announcements are published by tasks of their own
        await asyncio.sleep(0)
    return [
        m.reason
        for subject, m in bus.published
        if subject == subjects.conversation_closed() and isinstance(m, ConversationClosed)
    ]


async def run_for(seconds: float, clock: Clock, *replicas: ConversationTracker) -> int:
    """Move the clock `seconds` ahead in `STEP`s, each replica sweeping at every step; how many announced."""
    count = 0
    end = clock.now + seconds
    while clock.now < end:
        clock.now = min(clock.now + STEP, end)
        for r in replicas:
            count += await r.sweep()
    return count


async def test_prompts_alternating_between_replicas_are_announced_once_after_idle(
    bus: CountingBus, clock: Clock
) -> None:
    a, b = replica(bus, clock, "a"), replica(bus, clock, "b")
    for turn in range(6):
        r = (a, b)[turn % 2]
        r.touch("chat", "c1", ADA)
        await r.flush()
        await run_for(10, clock, a, b)
    last = clock.now - 10
    # Quiet for less than `IDLE` since the last prompt (on b): nobody announces.
    await run_for(last + IDLE - STEP - clock.now, clock, a, b)
    assert await announced(bus) == []
    # b saw the last prompt: it announces once `IDLE` passed; a would only after the grace.
    assert await run_for(STEP, clock, a) == 0
    assert await run_for(0.001, clock, b) == 1
    await run_for(5 * IDLE, clock, a, b)
    assert await announced(bus) == ["idle"]
    assert len(a) == len(b) == 0


async def test_prompts_within_the_debounce_are_written_once_and_idle_counts_from_the_last(
    bus: CountingBus, clock: Clock
) -> None:
    a, b = replica(bus, clock, "a"), replica(bus, clock, "b")
    start = clock.now
    for turn in range(8):  # a prompt every half second, alternating
        r = (a, b)[turn % 2]
        r.touch("chat", "c1", ADA)
        await r.flush()
        clock.now += 0.5
    last = clock.now - 0.5
    assert clock.now - start < DEBOUNCE
    assert bus.writes == 2  # one first write per replica; the rest waits for the debounce
    clock.now = start + DEBOUNCE  # a's debounce is over, b's (first write half a second later) not yet
    await a.flush()
    await b.flush()
    assert bus.writes == 3
    clock.now = start + 0.5 + DEBOUNCE
    await a.flush()
    await b.flush()
    assert bus.writes == 4  # one trailing write each, carrying its newest prompt
    clock.now = last + IDLE - 0.5
    assert await a.sweep() + await b.sweep() == 0
    clock.now = last + IDLE
    assert await a.sweep() + await b.sweep() == 1
    await run_for(3 * IDLE, clock, a, b)
    assert await announced(bus) == ["idle"]


async def test_a_socket_held_on_one_replica_keeps_the_conversation_open_on_the_other(
    bus: CountingBus, clock: Clock
) -> None:
    a, b = replica(bus, clock, "a"), replica(bus, clock, "b")
    a.socket_opened("chat", "c1", ADA)
    await a.flush()
    # Prompts reach b (say, over HTTP) now and then; then none for many idle timeouts.
    for _ in range(3):
        b.touch("chat", "c1", ADA)
        await b.flush()
        await run_for(IDLE / 2, clock, a, b)
    await run_for(5 * IDLE, clock, a, b)
    assert await announced(bus) == []
    # a refreshed its mark at its sweeps, not at every one (a handful of writes per idle timeout).
    assert bus.writes < 5 * 8
    clock.now += 1
    a.socket_closed("chat", "c1")
    await a.flush()
    assert await announced(bus) == ["disconnect"]
    await run_for(5 * IDLE, clock, a, b)
    assert await announced(bus) == ["disconnect"]
    assert len(a) == len(b) == 0


async def test_the_last_socket_to_leave_on_any_replica_closes_the_conversation(bus: CountingBus, clock: Clock) -> None:
    a, b = replica(bus, clock, "a"), replica(bus, clock, "b")
    a.socket_opened("chat", "c1", ADA)
    b.socket_opened("chat", "c1", ADA)
    await a.flush()
    await b.flush()
    await run_for(2 * IDLE, clock, a, b)
    a.socket_closed("chat", "c1")
    await a.flush()
    await run_for(3 * IDLE, clock, a, b)
    assert await announced(bus) == []  # b still holds one
    b.socket_closed("chat", "c1")
    await b.flush()
    await run_for(3 * IDLE, clock, a, b)
    assert await announced(bus) == ["disconnect"]


async def test_a_stopped_replica_s_socket_is_ended_by_the_other_once_after_the_grace(
    bus: CountingBus, clock: Clock
) -> None:
    a, b = replica(bus, clock, "a"), replica(bus, clock, "b")
    a.socket_opened("chat", "c1", ADA)
    await a.flush()
    b.touch("chat", "c1", ADA)
    await b.flush()
    await run_for(2 * IDLE, clock, a, b)
    # a stops: no refresh, no departure. Its last refresh was at most one sweep step ago.
    stopped = clock.now
    await run_for(IDLE + GRACE - 2 * STEP, clock, b)
    assert await announced(bus) == []
    await run_for(3 * STEP, clock, b)
    assert await announced(bus) == ["idle"]
    assert clock.now - stopped >= IDLE + GRACE - STEP
    await run_for(5 * IDLE, clock, b)
    assert await announced(bus) == ["idle"]


async def test_a_stopped_owner_s_prompts_are_ended_by_the_other_after_the_grace_not_before(
    bus: CountingBus, clock: Clock
) -> None:
    a, b = replica(bus, clock, "a"), replica(bus, clock, "b")
    b.touch("chat", "c1", ADA)
    await b.flush()
    clock.now += 10
    a.touch("chat", "c1", ADA)  # a is the owner now, then stops
    await a.flush()
    last = clock.now
    clock.now = last + IDLE
    assert await b.sweep() == 0  # the owner would have, had it lived
    clock.now = last + IDLE + GRACE - 0.001
    assert await b.sweep() == 0
    clock.now = last + IDLE + GRACE
    assert await b.sweep() == 1
    clock.now += 10 * IDLE
    assert await b.sweep() == 0
    # a comes back (the same process after a stall): it finds the conversation announced.
    assert await a.sweep() == 0
    assert await announced(bus) == ["idle"]
    assert len(a) == len(b) == 0


async def test_two_replicas_ending_the_same_stretch_at_once_announce_it_once(bus: CountingBus, clock: Clock) -> None:
    a, b = replica(bus, clock, "a"), replica(bus, clock, "b")
    a.touch("chat", "c1", ADA)
    await a.flush()
    b.touch("chat", "c1", ADA)
    await b.flush()
    clock.now += IDLE + GRACE + 1  # either may end it now: the owner, or the other past the grace
    counts = await asyncio.gather(a.sweep(), b.sweep())
    assert sum(counts) == 1
    assert await announced(bus) == ["idle"]


async def test_a_prompt_on_the_other_replica_after_a_disconnect_opens_a_new_stretch(
    bus: CountingBus, clock: Clock
) -> None:
    a, b = replica(bus, clock, "a"), replica(bus, clock, "b")
    a.socket_opened("chat", "c1", ADA)
    await a.flush()
    clock.now += 1
    a.socket_closed("chat", "c1")
    await a.flush()
    clock.now += 1
    b.touch("chat", "c1", ADA)
    await b.flush()
    await run_for(3 * IDLE, clock, a, b)
    assert await announced(bus) == ["disconnect", "idle"]


async def test_a_prompt_seen_before_the_announcement_is_covered_by_it(bus: CountingBus, clock: Clock) -> None:
    """b's prompt came while a's socket was open: a's "disconnect" covers it; b adds nothing."""
    a, b = replica(bus, clock, "a"), replica(bus, clock, "b")
    a.socket_opened("chat", "c1", ADA)
    await a.flush()
    b.touch("chat", "c1", ADA)
    await b.flush()
    clock.now += 0.5
    b.touch("chat", "c1", ADA)  # within b's debounce: not written yet
    clock.now += 0.5
    a.socket_closed("chat", "c1")
    await a.flush()
    await run_for(3 * IDLE, clock, a, b)
    assert await announced(bus) == ["disconnect"]


async def test_an_evicted_conversation_is_announced_by_its_owner_only(bus: CountingBus, clock: Clock) -> None:
    a = ConversationTracker(bus, idle_timeout=IDLE, instance="ingress-a", clock=clock, grace=GRACE, max_open=1)
    b = replica(bus, clock, "b")
    a.touch("chat", "c1", ADA)
    await a.flush()
    clock.now += 1
    b.touch("chat", "c1", ADA)  # b owns c1 now
    await b.flush()
    clock.now += 1
    a.touch("chat", "c2", ADA)  # a's bound lets c1 go: b owns it, so a says nothing
    await a.flush()
    assert await announced(bus) == []
    clock.now += 1
    a.touch("chat", "c3", ADA)  # a owns c2: letting it go announces it
    await a.flush()
    assert await announced(bus) == ["idle"]
    await run_for(3 * IDLE, clock, a, b)
    assert await announced(bus) == ["idle", "idle", "idle"]  # c2 early, then c1 by b and c3 by a
