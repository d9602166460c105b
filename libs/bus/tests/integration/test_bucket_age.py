"""`ATMO_AGENTS` entries expire: a bucket gets its max age on creation and on upgrade."""

from __future__ import annotations

from atmosphere.bus import JetStreamLayout, NatsBus, subjects
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.testing import wait_until


async def bucket_max_age(bus: NatsBus) -> float:
    info = await bus.client.jetstream().stream_info(f"KV_{bus.stream_name(subjects.AGENTS_BUCKET)}")
    return float(info.config.max_age or 0)


async def test_a_new_bucket_gets_the_layouts_max_age(nats_bus: NatsBus) -> None:
    await nats_bus.provision(JetStreamLayout(agents_max_age_seconds=42))
    assert await bucket_max_age(nats_bus) == 42


async def test_a_bucket_made_without_an_age_gets_it_and_its_stale_entries_expire(nats_bus: NatsBus) -> None:
    await nats_bus.provision(JetStreamLayout(agents_max_age_seconds=0))  # as an older version made it
    await nats_bus.kv_put(subjects.AGENTS_BUCKET, "old", AgentDescriptor(name="old"))
    assert await bucket_max_age(nats_bus) == 0

    await nats_bus.provision(JetStreamLayout(agents_max_age_seconds=1))
    assert await bucket_max_age(nats_bus) == 1

    async def expired() -> bool:
        return await nats_bus.kv_items(subjects.AGENTS_BUCKET, AgentDescriptor) == {}

    await wait_until(expired, timeout=15, what="the stale descriptor to expire")
    assert await nats_bus.kv_get(subjects.AGENTS_BUCKET, "old", AgentDescriptor) is None


async def test_provisioning_again_with_the_same_age_changes_nothing(nats_bus: NatsBus) -> None:
    await nats_bus.provision(JetStreamLayout(agents_max_age_seconds=30))
    await nats_bus.kv_put(subjects.AGENTS_BUCKET, "echo", AgentDescriptor(name="echo"))
    await nats_bus.provision(JetStreamLayout(agents_max_age_seconds=30))
    assert await bucket_max_age(nats_bus) == 30
    assert await nats_bus.kv_get(subjects.AGENTS_BUCKET, "echo", AgentDescriptor) == AgentDescriptor(name="echo")
