"""Dispatch finds the Cohere runtime through its entry point and hands it its own environment."""

from __future__ import annotations

from atmosphere.sdk.runtime import AgentRuntime, RuntimeConfig, discover_runtimes


def discovered(environ: dict[str, str]) -> dict[str, AgentRuntime]:
    return {runtime.name: runtime for runtime in discover_runtimes(RuntimeConfig(), environ=environ)}


def test_its_settings_come_from_the_environment_and_no_one_elses_do() -> None:
    runtimes = discovered({"CO_API_KEY": "co-test", "COHERE_MODEL": "command-x", "OPENAI_API_KEY": "no"})
    cohere = runtimes["cohere"]
    assert cohere.is_available()
    assert cohere.config.extra == {"CO_API_KEY": "co-test", "COHERE_MODEL": "command-x"}
    assert runtimes["built-in"].config.extra == {}


def test_unconfigured_it_says_what_to_set() -> None:
    cohere = discovered({})["cohere"]
    assert not cohere.is_available()
    assert cohere.unavailable_reason() == "no Cohere credentials: set CO_API_KEY"
    gateway = discovered({"COHERE_BASE_URL": "gateway.internal:8080", "CO_API_URL": "https://sdk.example"})["cohere"]
    assert gateway.unavailable_reason() == "COHERE_BASE_URL is not an http(s) URL"
    sdk_named = discovered({"CO_API_URL": "gateway.internal:8080"})["cohere"]
    assert sdk_named.unavailable_reason() == "CO_API_URL is not an http(s) URL"
