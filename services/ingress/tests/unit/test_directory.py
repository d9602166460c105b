"""The agent directory: a cached view of `ATMO_AGENTS` that finds a newly served agent quickly."""

from __future__ import annotations

from atmosphere.bus import JetStreamLayout, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.ingress.handlers import AgentDirectory

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
