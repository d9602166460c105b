"""The console info's `pools` block: every dispatch pool serving agents now, from their descriptors."""

from __future__ import annotations

from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.ingress.admin_api import runtime_pools


def test_each_pool_is_listed_once_with_its_runtime_and_agents() -> None:
    why = "INACTIVE(runtime anthropic is not installed (pip install atmosphere-ai-runtime-anthropic))"
    agents = [
        AgentDescriptor(name="echo", runtime="built-in", runtime_state="ACTIVE", capabilities=["TEXT_STREAMING"]),
        AgentDescriptor(name="graph", pool="langgraph", runtime="langgraph", runtime_state="ACTIVE"),
        AgentDescriptor(name="claude", pool="anthropic", runtime="", runtime_state=why),
        AgentDescriptor(name="chain", pool="langgraph", runtime="langgraph", runtime_state="ACTIVE"),
    ]
    assert runtime_pools(agents) == {
        "anthropic": {"runtime": None, "state": why, "capabilities": [], "agents": ["claude"]},
        "default": {"runtime": "built-in", "state": "ACTIVE", "capabilities": ["TEXT_STREAMING"], "agents": ["echo"]},
        "langgraph": {"runtime": "langgraph", "state": "ACTIVE", "capabilities": [], "agents": ["graph", "chain"]},
    }


def test_a_descriptor_from_before_pools_reads_from_its_runtime() -> None:
    # A dispatch of the version before runtime states were described: no state, its runtime named.
    assert runtime_pools([AgentDescriptor(name="old", runtime="built-in")])["default"]["state"] == "ACTIVE"
    assert runtime_pools([AgentDescriptor(name="none")])["default"]["state"] == "INACTIVE"
    assert runtime_pools([]) == {}
