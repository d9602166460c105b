"""Dispatch finds the Anthropic runtime through its entry point and hands it its own environment."""

from __future__ import annotations

from atmosphere.sdk.runtime import AgentRuntime, RuntimeConfig, discover_runtimes


def discovered(environ: dict[str, str]) -> dict[str, AgentRuntime]:
    return {runtime.name: runtime for runtime in discover_runtimes(RuntimeConfig(), environ=environ)}


def test_its_settings_come_from_the_environment_and_no_one_elses_do() -> None:
    runtimes = discovered({"ANTHROPIC_API_KEY": "sk-test", "ANTHROPIC_MODEL": "claude-x", "OPENAI_API_KEY": "no"})
    anthropic = runtimes["anthropic"]
    assert anthropic.is_available()
    assert anthropic.config.extra == {"ANTHROPIC_API_KEY": "sk-test", "ANTHROPIC_MODEL": "claude-x"}
    assert runtimes["built-in"].config.extra == {}


def test_unconfigured_it_says_what_to_set() -> None:
    anthropic = discovered({})["anthropic"]
    assert not anthropic.is_available()
    assert anthropic.unavailable_reason() == "no Anthropic credentials: set ANTHROPIC_API_KEY"
    gateway = discovered({"ANTHROPIC_BASE_URL": "gateway.internal:8080"})["anthropic"]
    assert gateway.unavailable_reason() == "ANTHROPIC_BASE_URL is not an http(s) URL"
