"""Ingress's conversation bookkeeping (one replica), the admin's path pre-check, and conversation keys."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re

import pytest

from atmosphere.bus import JetStreamLayout, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.memory.v1.memory_pb2 import ConversationClosed
from atmosphere.ingress.agent_prompts import conversation_of
from atmosphere.ingress.conversations import ConversationTracker
from atmosphere.ingress.errors import MalformedRequestError as InboundError
from atmosphere.ingress.workspace_api import traversal_shaped

ADA = Principal(user_id="ada", auth_method="bearer")
IDLE = 60.0


class Clock:
    """Epoch seconds under the test's control."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def bus() -> FakeBus:
    """A bus with the system's buckets, `ATMO_CONVERSATIONS` among them."""
    fake = FakeBus()
    await fake.provision(JetStreamLayout())
    return fake


def tracker_on(bus: FakeBus, clock: Clock, **options: int) -> ConversationTracker:
    return ConversationTracker(bus, idle_timeout=IDLE, instance="ingress-a", clock=clock, **options)


async def announced(bus: FakeBus) -> list[tuple[str, str, str, str]]:
    """Every `ConversationClosed` published so far: (agent, conversation, reason, user)."""
    for _ in range(5):  # announcements are published by tasks of their own
        await asyncio.sleep(0)
    return [
        (m.agent, m.conversation_id, m.reason, m.principal.user_id)
        for subject, m in bus.published
        if subject == subjects.conversation_closed() and isinstance(m, ConversationClosed)
    ]


# -- ConversationTracker, one replica ---------------------------------------------------------------


async def test_the_last_socket_to_leave_closes_the_conversation_once(bus: FakeBus, clock: Clock) -> None:
    tracker = tracker_on(bus, clock)
    tracker.socket_opened("chat", "c1", ADA)
    tracker.socket_opened("chat", "c1", ADA)
    await tracker.flush()
    assert len(tracker) == 1
    tracker.socket_closed("chat", "c1")
    await tracker.flush()
    assert await announced(bus) == []
    clock.now += 1
    tracker.socket_closed("chat", "c1")
    await tracker.flush()
    assert await announced(bus) == [("chat", "c1", "disconnect", "ada")]
    assert len(tracker) == 0
    # Late or unknown closes announce nothing more, and neither does a later sweep.
    tracker.socket_closed("chat", "c1")
    tracker.socket_closed("chat", "never-opened")
    clock.now += 10 * IDLE
    await tracker.flush()
    assert await tracker.sweep() == 0
    assert len(await announced(bus)) == 1


async def test_a_socket_that_opens_and_leaves_before_any_write_still_closes_it(bus: FakeBus, clock: Clock) -> None:
    tracker = tracker_on(bus, clock)
    tracker.socket_opened("chat", "c1", ADA)
    tracker.socket_closed("chat", "c1")
    await tracker.flush()
    assert await announced(bus) == [("chat", "c1", "disconnect", "ada")]


async def test_conversations_are_keyed_by_agent_and_id(bus: FakeBus, clock: Clock) -> None:
    tracker = tracker_on(bus, clock)
    tracker.socket_opened("chat", "c1", ADA)
    tracker.socket_opened("other", "c1", ADA)
    await tracker.flush()
    tracker.socket_closed("chat", "c1")
    await tracker.flush()
    assert await announced(bus) == [("chat", "c1", "disconnect", "ada")]
    assert len(tracker) == 1


async def test_an_idle_conversation_is_announced_once_by_the_sweep(bus: FakeBus, clock: Clock) -> None:
    tracker = tracker_on(bus, clock)
    start = clock.now
    tracker.touch("chat", "c1", ADA)
    clock.now += 10
    tracker.touch("chat", "c2", ADA)
    await tracker.flush()
    clock.now = start + IDLE - 1
    assert await tracker.sweep() == 0
    assert await announced(bus) == []
    clock.now = start + IDLE  # c1 is exactly `IDLE` old
    assert await tracker.sweep() == 1
    assert await announced(bus) == [("chat", "c1", "idle", "ada")]
    assert await tracker.sweep() == 0
    clock.now = start + 10 + IDLE
    assert await tracker.sweep() == 1
    assert await announced(bus) == [("chat", "c1", "idle", "ada"), ("chat", "c2", "idle", "ada")]
    clock.now += 10 * IDLE
    assert await tracker.sweep() == 0


async def test_a_prompt_keeps_a_conversation_open(bus: FakeBus, clock: Clock) -> None:
    tracker = tracker_on(bus, clock)
    tracker.touch("chat", "c1", ADA)
    await tracker.flush()
    clock.now += IDLE - 1
    tracker.touch("chat", "c1", ADA)
    await tracker.flush()
    clock.now += 1
    assert await tracker.sweep() == 0
    clock.now += IDLE
    assert await tracker.sweep() == 1


async def test_a_prompt_within_the_debounce_is_recorded_late_not_lost(bus: FakeBus, clock: Clock) -> None:
    """A prompt right after a write waits for the debounce; idle still counts from that prompt."""
    tracker = tracker_on(bus, clock)
    tracker.touch("chat", "c1", ADA)
    await tracker.flush()
    clock.now += 1
    last = clock.now
    tracker.touch("chat", "c1", ADA)
    await tracker.flush()  # too soon: not written yet
    clock.now += 10
    await tracker.flush()  # written now, with the prompt's own time
    clock.now = last + IDLE - 0.5
    assert await tracker.sweep() == 0
    clock.now = last + IDLE
    assert await tracker.sweep() == 1


async def test_a_new_prompt_reopens_an_announced_conversation(bus: FakeBus, clock: Clock) -> None:
    tracker = tracker_on(bus, clock)
    tracker.touch("chat", "c1", ADA)
    await tracker.flush()
    clock.now += IDLE
    assert await tracker.sweep() == 1
    tracker.touch("chat", "c1", ADA)  # in the very millisecond of the announcement: a new stretch still
    await tracker.flush()
    assert len(tracker) == 1
    clock.now += IDLE
    assert await tracker.sweep() == 1
    assert await announced(bus) == [("chat", "c1", "idle", "ada")] * 2
    # A socket that reconnects after an idle announcement closes its new stretch on leaving.
    clock.now += 1
    tracker.socket_opened("chat", "c1", ADA)
    await tracker.flush()
    clock.now += 1
    tracker.socket_closed("chat", "c1")
    await tracker.flush()
    assert (await announced(bus))[-1] == ("chat", "c1", "disconnect", "ada")
    assert len(await announced(bus)) == 3


async def test_the_bound_announces_the_stalest_conversation(bus: FakeBus, clock: Clock) -> None:
    tracker = tracker_on(bus, clock, max_open=2)
    tracker.touch("chat", "a", ADA)
    clock.now += 1
    tracker.touch("chat", "b", ADA)
    clock.now += 1
    tracker.touch("chat", "a", ADA)  # a is fresher than b now
    await tracker.flush()
    clock.now += 1
    tracker.touch("chat", "c", ADA)
    assert len(tracker) == 2
    await tracker.flush()
    assert await announced(bus) == [("chat", "b", "idle", "ada")]
    tracker.touch("chat", "c", ADA)  # known: no eviction
    await tracker.flush()
    assert len(await announced(bus)) == 1
    clock.now += 10 * IDLE
    assert await tracker.sweep() == 2  # a and c; b is not announced again
    assert sorted(c for _, c, _, _ in await announced(bus)) == ["a", "b", "c"]


async def test_without_the_bucket_a_replica_decides_alone_and_prompts_never_wait(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    bus = FakeBus()  # nothing provisioned: every bucket call fails
    tracker = tracker_on(bus, clock)
    with caplog.at_level(logging.WARNING, logger="atmosphere.ingress"):
        tracker.touch("chat", "c1", ADA)
        tracker.socket_opened("chat", "c2", ADA)
        await tracker.flush()
        tracker.socket_closed("chat", "c2")
        await tracker.flush()
        assert await announced(bus) == [("chat", "c2", "disconnect", "ada")]
        clock.now += IDLE - 1
        assert await tracker.sweep() == 0
        clock.now += 1
        assert await tracker.sweep() == 1
    assert (await announced(bus))[-1] == ("chat", "c1", "idle", "ada")
    outage = [r for r in caplog.records if "per instance" in r.getMessage()]
    assert len(outage) == 1  # once per outage, not once per conversation


async def test_the_sweeper_runs_until_stopped(bus: FakeBus) -> None:
    tracker = ConversationTracker(bus, idle_timeout=0.05)
    tracker.touch("chat", "c1", ADA)
    stop = asyncio.Event()
    sweeper = asyncio.create_task(tracker.run_sweeper(stop, every=0.01))
    async with asyncio.timeout(5):
        while not await announced(bus):
            await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(sweeper, 5)
    assert await announced(bus) == [("chat", "c1", "idle", "ada")]


async def test_a_stopping_sweeper_announces_the_sockets_that_just_left(bus: FakeBus) -> None:
    tracker = ConversationTracker(bus, idle_timeout=IDLE)
    stop = asyncio.Event()
    sweeper = asyncio.create_task(tracker.run_sweeper(stop))
    tracker.socket_opened("chat", "c1", ADA)
    tracker.socket_closed("chat", "c1")
    stop.set()
    await asyncio.wait_for(sweeper, 5)
    assert await announced(bus) == [("chat", "c1", "disconnect", "ada")]


# -- traversal_shaped ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "hostile"),
    [
        ("．．／x", True),  # fullwidth ../x: NFKC makes it a traversal
        ("\u2025/x", True),  # TWO DOT LEADER normalizes to ".."
        ("\uff0e\uff0e", True),
        ("a/../b", True),
        ("../x", True),
        ("..", True),
        ("x/..", True),
        ("/etc", True),
        ("/", True),
        ("a\\b", True),
        ("..\\x", True),
        ("\\\\server\\share", True),
        ("a\x00b", True),
        ("./x", True),
        ("x/.", True),
        ("a/./b", True),
        ("x/", True),
        ("a//b", True),
        ("ａ.txt", True),  # anything NFKC would change is refused, not guessed at
        (".", False),  # the root
        ("", False),
        ("notes/todo.md", False),
        ("a..b", False),
        (".hidden", False),
        ("..%2fetc", False),  # never URL-decoded: just a file name
        ("dir/sub/file.txt", False),
        ("café.md", False),
        ("tool-output/grep-1a2b3c4d.txt", False),
    ],
)
def test_traversal_shaped(path: str, hostile: bool) -> None:
    assert traversal_shaped(path) is hostile


# -- conversation_of -------------------------------------------------------------------------------


@pytest.mark.parametrize("given", [None, ""])
def test_no_conversation_id_means_a_fresh_one(given: str | None) -> None:
    first = conversation_of(given, Principal())
    assert re.fullmatch(r"[0-9a-f]{32}", first)
    assert conversation_of(given, Principal()) != first
    # A user's fresh conversation is scoped like a named one: it counts against their own quotas.
    ada = hashlib.sha256(b"ada").hexdigest()[:16]
    assert re.fullmatch(rf"{ada}--[0-9a-f]{{32}}", conversation_of(given, ADA))


def test_an_authenticated_users_conversation_is_scoped_under_their_id() -> None:
    ada = hashlib.sha256(b"ada").hexdigest()[:16]
    assert conversation_of("c1", ADA) == f"{ada}--c1"
    assert conversation_of("c1", Principal(user_id="bob")) != conversation_of("c1", ADA)
    assert conversation_of("team:c@1", ADA) == f"{ada}--team:c@1"
    # Any user id stays a safe path segment, and a `--` in ids cannot make two keys collide.
    assert conversation_of("c1", Principal(user_id="../x/..")).endswith("--c1")
    assert "/" not in conversation_of("c1", Principal(user_id="../x/.."))
    assert conversation_of("x--c1", ADA) != conversation_of("c1", Principal(user_id="ada--x"))
    assert conversation_of("c1", Principal(user_id=" Anonymous ")) == "c1"


@pytest.mark.parametrize("principal", [Principal(), Principal(user_id="anonymous", auth_method="anonymous")])
def test_an_anonymous_conversation_is_unscoped(principal: Principal) -> None:
    assert conversation_of("c1", principal) == "c1"
    assert conversation_of("x" * 128, principal) == "x" * 128


@pytest.mark.parametrize("given", ["a b", "a.b", "a/b", "../x", "*", ">", "c1\n", "x" * 129, "ｃ１"])
def test_a_malformed_conversation_id_is_refused(given: str) -> None:
    with pytest.raises(InboundError, match="Malformed conversation id"):
        conversation_of(given, ADA)
