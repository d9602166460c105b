"""Dispatch finds the CrewAI runtime through its entry point, configured from `LLM_*`."""

from __future__ import annotations

from atmosphere.runtimes.crewai import CrewAiAgentRuntime
from atmosphere.sdk.runtime import AgentRuntime, RuntimeConfig, discover_runtimes


def discovered(config: RuntimeConfig) -> dict[str, AgentRuntime]:
    return {runtime.name: runtime for runtime in discover_runtimes(config, environ={})}


def test_it_is_discovered_and_reads_the_llm_settings() -> None:
    runtime = discovered(RuntimeConfig(base_url="http://127.0.0.1:8000/v1", model="m"))["crewai"]
    assert isinstance(runtime, CrewAiAgentRuntime)
    assert (runtime.priority, runtime.is_available(), runtime.unavailable_reason()) == (100, True, "")


def test_unconfigured_it_says_what_to_set() -> None:
    assert discovered(RuntimeConfig())["crewai"].unavailable_reason() == "no model configured: set LLM_BASE_URL"
    gateway = discovered(RuntimeConfig(base_url="gateway.internal:8080"))["crewai"]
    assert not gateway.is_available()
    assert gateway.unavailable_reason() == "LLM_BASE_URL is not an http(s) URL"
