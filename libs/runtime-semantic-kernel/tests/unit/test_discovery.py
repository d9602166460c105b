"""Dispatch finds the Semantic Kernel runtime through its entry point; SK, as the runtime loads it, stays quiet."""

from __future__ import annotations

from semantic_kernel.utils.telemetry import user_agent
from semantic_kernel.utils.telemetry.model_diagnostics import decorators

from atmosphere.runtimes.semantic_kernel._runtime import QUIET_FRAMEWORK
from atmosphere.sdk.runtime import AgentRuntime, RuntimeConfig, discover_runtimes


def discovered(config: RuntimeConfig) -> AgentRuntime:
    [runtime] = [r for r in discover_runtimes(config, environ={}) if r.name == "semantic-kernel"]
    return runtime


def test_it_is_available_with_an_http_provider_and_says_what_to_set_otherwise() -> None:
    runtime = discovered(RuntimeConfig(base_url="http://127.0.0.1:8000/v1"))
    assert (runtime.priority, runtime.is_available(), runtime.unavailable_reason()) == (100, True, "")
    assert discovered(RuntimeConfig()).unavailable_reason() == "no model configured: set LLM_BASE_URL"
    assert (
        discovered(RuntimeConfig(base_url="gateway:8080")).unavailable_reason() == "LLM_BASE_URL is not an http(s) URL"
    )


def test_sk_as_the_runtime_loaded_it_sends_no_version_headers_and_records_no_diagnostics() -> None:
    # This process imported SK through the runtime (tests/conftest.py), as dispatch does.
    assert set(QUIET_FRAMEWORK) == {
        "SEMANTICKERNEL_EXPERIMENTAL_GENAI_ENABLE_OTEL_DIAGNOSTICS",
        "SEMANTICKERNEL_EXPERIMENTAL_GENAI_ENABLE_OTEL_DIAGNOSTICS_SENSITIVE",
        "AZURE_TELEMETRY_DISABLED",
    }
    assert user_agent.IS_TELEMETRY_ENABLED is False
    assert decorators.are_model_diagnostics_enabled() is False
