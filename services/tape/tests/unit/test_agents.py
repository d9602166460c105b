"""Agent facts from `ATMO_AGENTS`: looked up once per agent for a while, never a failed batch."""

from __future__ import annotations

from atmosphere.bus import JetStreamLayout, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.tape.agents import UNKNOWN, AgentDirectory, AgentFacts


async def test_facts_come_from_the_bucket_and_are_kept_for_a_while() -> None:
    bus = FakeBus()
    now = [0.0]
    directory = AgentDirectory(bus, refresh=60, clock=lambda: now[0])
    assert await directory.facts("echo") == UNKNOWN  # no bucket yet: unknown, not an error
    await bus.provision(JetStreamLayout())
    await bus.kv_put(subjects.AGENTS_BUCKET, "echo", AgentDescriptor(name="echo", path="/a/echo", runtime="rt"))
    assert await directory.facts("echo") == UNKNOWN  # still the remembered answer
    now[0] = 61
    assert await directory.facts("echo") == AgentFacts(runtime="rt", endpoint="/a/echo")
    assert await directory.facts("") == UNKNOWN
    assert await AgentDirectory(None).facts("echo") == UNKNOWN
