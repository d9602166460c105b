"""How dispatch finds the runtime: its name, priority and availability."""

from __future__ import annotations

from atmosphere.runtimes.llamaindex import LlamaIndexAgentRuntime
from atmosphere.sdk.runtime import RuntimeConfig, discover_runtimes, resolve_runtime


def test_it_is_chosen_only_where_a_provider_is_configured() -> None:
    runtime = LlamaIndexAgentRuntime(RuntimeConfig(base_url="http://127.0.0.1:1/v1"))
    assert (runtime.name, runtime.priority) == ("llamaindex", 100)
    assert resolve_runtime([runtime]) is runtime
    unset = LlamaIndexAgentRuntime(RuntimeConfig())
    assert not unset.is_available()
    assert unset.unavailable_reason() == "no model configured: set LLM_BASE_URL"
    assert LlamaIndexAgentRuntime(RuntimeConfig(base_url="unix:///x")).unavailable_reason() == (
        "LLM_BASE_URL is not an http(s) URL"
    )
    assert resolve_runtime([unset]) is None
    assert "llamaindex" in {r.name for r in discover_runtimes(RuntimeConfig(base_url="http://127.0.0.1:1/v1"))}
