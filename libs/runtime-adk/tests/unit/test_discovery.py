"""Dispatch finds the ADK runtime through its entry point and hands it its own environment."""

from __future__ import annotations

from google.adk.agents import LlmAgent

from atmosphere.runtimes.adk import DEFAULT_MODEL, AdkAgentRuntime
from atmosphere.sdk.runtime import AgentRuntime, RuntimeConfig, discover_runtimes


def discovered(environ: dict[str, str]) -> dict[str, AgentRuntime]:
    return {runtime.name: runtime for runtime in discover_runtimes(RuntimeConfig(), environ=environ)}


def test_its_settings_come_from_the_environment_and_no_one_elses_do() -> None:
    runtimes = discovered({"GOOGLE_API_KEY": "g-test", "GEMINI_MODEL": "gemini-x", "OPENAI_API_KEY": "no"})
    adk = runtimes["adk"]
    assert isinstance(adk, AdkAgentRuntime)
    assert (adk.name, adk.priority, adk.is_available()) == ("adk", 100, True)
    assert adk.config.extra == {"GOOGLE_API_KEY": "g-test", "GEMINI_MODEL": "gemini-x"}
    assert (adk.settings.api_key, adk.settings.model) == ("g-test", "gemini-x")
    assert runtimes["built-in"].config.extra == {}


def test_google_genais_other_key_and_base_url_are_read_too() -> None:
    adk = discovered({"GEMINI_API_KEY": "k2", "GOOGLE_GEMINI_BASE_URL": "http://gateway:8080"})["adk"]
    assert isinstance(adk, AdkAgentRuntime)
    assert (adk.settings.api_key, adk.settings.base_url, adk.settings.model) == (
        "k2",
        "http://gateway:8080",
        DEFAULT_MODEL,
    )
    assert DEFAULT_MODEL == LlmAgent.DEFAULT_MODEL  # ADK's own default, for an agent that names none


def test_unconfigured_it_says_what_to_set() -> None:
    adk = discovered({})["adk"]
    assert not adk.is_available()
    assert adk.unavailable_reason() == "no Gemini credentials: set GOOGLE_API_KEY"
    gateway = discovered({"GOOGLE_GEMINI_BASE_URL": "gateway.internal:8080"})["adk"]
    assert gateway.unavailable_reason() == "GOOGLE_GEMINI_BASE_URL is not an http(s) URL"
