"""Dispatch finds the AgentScope runtime through its entry point, configured by `LLM_*`.

`tests/test_runtime_adapters.py` checks that loading it imports no framework.
"""

from __future__ import annotations

from atmosphere.runtimes.agentscope import AgentScopeAgentRuntime
from atmosphere.sdk.runtime import RuntimeConfig, discover_runtimes


def test_it_is_discovered_and_configured_by_llm_settings() -> None:
    [runtime] = [r for r in discover_runtimes(RuntimeConfig(base_url="http://llm:8000/v1")) if r.name == "agentscope"]
    assert isinstance(runtime, AgentScopeAgentRuntime)
    assert (runtime.priority, runtime.is_available()) == (100, True)


def test_unconfigured_it_says_what_to_set() -> None:
    assert AgentScopeAgentRuntime(RuntimeConfig()).unavailable_reason() == "no model configured: set LLM_BASE_URL"
    gateway = AgentScopeAgentRuntime(RuntimeConfig(base_url="llm:8000"))
    assert gateway.unavailable_reason() == "LLM_BASE_URL is not an http(s) URL"
