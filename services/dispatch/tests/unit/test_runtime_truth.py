"""What dispatch reports about its runtime, and how it keeps its agents listed."""

from __future__ import annotations

import asyncio

from google.protobuf.message import Message

from atmosphere.bus import BusError, JetStreamLayout, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.dispatch.app import runtime_info
from atmosphere.dispatch.descriptors import live_descriptors
from atmosphere.dispatch.runtime.openai import BuiltInAgentRuntime
from atmosphere.sdk.runtime import RuntimeConfig
from atmosphere.testing import wait_until

AGENTS = [AgentDescriptor(name="echo", path="/atmosphere/agent/echo")]


def test_without_a_provider_url_the_runtime_is_inactive_and_names_the_setting() -> None:
    unconfigured = BuiltInAgentRuntime(RuntimeConfig())
    assert runtime_info(None, [unconfigured], base_url="") == {
        "state": "INACTIVE(no model configured: set LLM_BASE_URL)",
        "name": None,
        "model": None,
        "capabilities": [],
    }


def test_a_provider_url_that_is_not_http_is_no_runtime_either() -> None:
    misconfigured = BuiltInAgentRuntime(RuntimeConfig(base_url="localhost:8080/v1"))
    assert not misconfigured.is_available()
    info = runtime_info(None, [misconfigured], base_url="localhost:8080/v1")
    assert info["state"] == "INACTIVE(LLM_BASE_URL is not an http(s) URL)"


def test_without_any_runtime_installed_it_says_so() -> None:
    assert runtime_info(None, [], base_url="http://model/v1")["state"] == "INACTIVE(no runtime installed)"


def test_an_available_runtime_is_active_with_its_capabilities() -> None:
    runtime = BuiltInAgentRuntime(RuntimeConfig(base_url="http://model/v1", model="m"))
    info = runtime_info(runtime, [runtime], base_url="http://model/v1")
    assert (info["state"], info["name"], info["model"]) == ("ACTIVE", "built-in", "m")
    assert "TEXT_STREAMING" in info["capabilities"]


class FlakyBucket(FakeBus):
    """Refuses the first `failures` writes after the first one, as a broker that is away."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.writes = 0

    async def kv_put(self, bucket: str, key: str, message: Message) -> None:
        self.writes += 1
        if 1 < self.writes <= 1 + self.failures:
            msg = "nats: no servers available"
            raise BusError(msg)
        await super().kv_put(bucket, key, message)


async def test_descriptors_are_rewritten_after_failed_writes_until_the_context_ends() -> None:
    bus = FlakyBucket(failures=2)
    await bus.provision(JetStreamLayout())
    async with live_descriptors(bus, AGENTS, max_age=0.3):
        assert await bus.kv_get(subjects.AGENTS_BUCKET, "echo", AgentDescriptor) == AGENTS[0]

        async def rewritten() -> bool:
            return bus.writes >= 4  # the first write, two refused, one that went through again

        await wait_until(rewritten, what="a rewrite after the refused ones")
    written = bus.writes
    await asyncio.sleep(0.3)  # three ticks' worth: none may come after the context ended
    assert bus.writes == written


async def test_with_no_max_age_descriptors_are_written_once() -> None:
    bus = FlakyBucket(failures=0)
    await bus.provision(JetStreamLayout())
    tasks_before = len(asyncio.all_tasks())
    async with live_descriptors(bus, AGENTS, max_age=0):
        assert len(asyncio.all_tasks()) == tasks_before  # no refresher
    assert bus.writes == 1
