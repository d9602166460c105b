"""The agent directory: a cached view of `ATMO_AGENTS` that finds a newly served agent quickly."""

from __future__ import annotations

import asyncio
from typing import Any

from atmosphere.bus import BusError, JetStreamLayout, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.ingress.directory import AgentDirectory

HOUR = 3600.0


async def directory_with(*names: str, miss_ttl: float) -> tuple[FakeBus, AgentDirectory]:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    for name in names:
        await bus.kv_put(subjects.AGENTS_BUCKET, name, AgentDescriptor(name=name, path=f"/atmosphere/agent/{name}"))
    return bus, AgentDirectory(bus, ttl=HOUR, miss_ttl=miss_ttl)


async def test_a_miss_rereads_the_bucket_so_an_agent_served_late_is_found() -> None:
    bus, directory = await directory_with("echo", miss_ttl=0)
    assert await directory.lookup("late") is None
    await bus.kv_put(subjects.AGENTS_BUCKET, "late", AgentDescriptor(name="late", path="/late"))
    assert (await directory.lookup("late")) == AgentDescriptor(name="late", path="/late")
    assert (await directory.by_path("/late")) is not None


async def test_a_miss_is_cached_for_miss_ttl_and_a_hit_for_ttl() -> None:
    bus, directory = await directory_with("echo", miss_ttl=HOUR)
    assert (await directory.lookup("echo")) is not None
    await bus.kv_put(subjects.AGENTS_BUCKET, "late", AgentDescriptor(name="late", path="/late"))
    # Both reads are within their TTLs, so neither goes back to the bucket.
    assert await directory.lookup("late") is None
    assert await directory.by_path("/late") is None
    assert [d.name for d in await directory.all()] == ["echo"]


async def test_all_rereads_after_a_miss_the_caller_reports() -> None:
    bus, directory = await directory_with("echo", miss_ttl=0)
    assert [d.name for d in await directory.all()] == ["echo"]
    await bus.kv_put(subjects.AGENTS_BUCKET, "late", AgentDescriptor(name="late", path="/late"))
    assert [d.name for d in await directory.all()] == ["echo"]  # within the TTL
    assert [d.name for d in await directory.all(after_miss=True)] == ["echo", "late"]


class CountingBroker(FakeBus):
    """Counts bucket reads; `fail` makes them fail as a broker that does not answer."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.fail = False

    async def kv_items(self, bucket: str, message_type: Any) -> Any:
        self.reads += 1
        await asyncio.sleep(0.05)  # a read in flight while other callers arrive
        if self.fail:
            msg = "nats: timeout"
            raise BusError(msg)
        return await super().kv_items(bucket, message_type)


async def test_callers_who_arrive_together_share_one_read() -> None:
    bus = CountingBroker()
    await bus.provision(JetStreamLayout())
    await bus.kv_put(subjects.AGENTS_BUCKET, "echo", AgentDescriptor(name="echo", path="/atmosphere/agent/echo"))
    directory = AgentDirectory(bus, ttl=HOUR, miss_ttl=HOUR)
    found = await asyncio.gather(*(directory.lookup("echo") for _ in range(20)))
    assert all(d is not None for d in found)
    assert bus.reads == 1


async def test_an_unreadable_bucket_fails_every_waiter_once_then_the_last_copy_serves() -> None:
    bus = CountingBroker()
    await bus.provision(JetStreamLayout())
    await bus.kv_put(subjects.AGENTS_BUCKET, "echo", AgentDescriptor(name="echo", path="/atmosphere/agent/echo"))
    directory = AgentDirectory(bus, ttl=0, miss_ttl=0)
    bus.fail = True
    results = await asyncio.gather(*(directory.lookup("echo") for _ in range(10)), return_exceptions=True)
    assert all(isinstance(r, BusError) for r in results)
    assert bus.reads == 1  # ten waiters, one timeout
    bus.fail = False
    assert await directory.lookup("echo") is not None
    bus.fail = True  # the broker goes away again: the agents read before still resolve
    assert await directory.lookup("echo") is not None


class Clock:
    """Monotonic seconds a test sets by hand."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_the_first_lookup_reads_the_bucket_on_a_machine_booted_a_moment_ago() -> None:
    # A monotonic clock counts from boot: "never read" must not pass for "read 1 ms ago".
    clock = Clock(now=0.001)
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    await bus.kv_put(subjects.AGENTS_BUCKET, "echo", AgentDescriptor(name="echo", path="/atmosphere/agent/echo"))
    directory = AgentDirectory(bus, ttl=HOUR, miss_ttl=HOUR, clock=clock)
    assert await directory.lookup("echo") is not None
    assert [d.name for d in await directory.all()] == ["echo"]


async def test_the_copy_is_read_again_once_the_ttl_has_passed_on_the_injected_clock() -> None:
    clock = Clock(now=0.001)
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    directory = AgentDirectory(bus, ttl=2.0, miss_ttl=HOUR, clock=clock)
    assert await directory.all() == []
    await bus.kv_put(subjects.AGENTS_BUCKET, "late", AgentDescriptor(name="late", path="/late"))
    clock.now += 1.9
    assert await directory.all() == []  # still within the TTL
    clock.now += 0.2
    assert [d.name for d in await directory.all()] == ["late"]
