"""An Atmosphere agent on AgentScope: what the contract suite does not pin."""

from __future__ import annotations

import logging

import pytest

from atmosphere.runtimes.agentscope import AgentScopeAgentRuntime
from atmosphere.sdk import AiRequest
from atmosphere.sdk.runtime import RuntimeConfig, ToolCallRequest
from atmosphere.testing.model_turns import ToolCallScript, Turn
from atmosphere.testing.runtime_contract import TIME, WEATHER, City, Recorder, context
from atmosphere.testing.scripted_model import ScriptedModel


class PlatformFailedError(Exception):
    """What the choke point raises when the platform itself fails (not a tool's error)."""


def runtime_for(provider: ScriptedModel) -> AgentScopeAgentRuntime:
    return AgentScopeAgentRuntime(RuntimeConfig(base_url=provider.base_url, model="fake-model", stall_timeout=5.0))


async def test_a_failure_of_the_choke_point_ends_the_run_as_raised(fake_provider: ScriptedModel) -> None:
    # AgentScope answers a failing tool with its text and gathers concurrent failures in a group:
    # neither may hide the platform's own error from dispatch.
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "Oslo"}), ToolCallScript("get_time", {"city": "Oslo"})),
        Turn.text("never asked"),
    )

    async def failing(call: ToolCallRequest) -> str:
        raise PlatformFailedError(call.name)

    recorder = Recorder()
    runtime = runtime_for(fake_provider)
    try:
        ctx = context(recorder, AiRequest(message="Oslo?"), tools=(WEATHER, TIME), run_tool=failing)
        with pytest.raises(PlatformFailedError):
            await runtime.execute(ctx, recorder.session)
    finally:
        await runtime.aclose()
    assert len(fake_provider.requests) == 1


async def test_structured_output_is_refused_with_a_reason(fake_provider: ScriptedModel) -> None:
    recorder = Recorder()
    runtime = runtime_for(fake_provider)
    try:
        await runtime.execute(context(recorder, AiRequest(message="?", response_format=City)), recorder.session)
    finally:
        await runtime.aclose()
    error = recorder.terminal().error
    assert (error.code, error.message.split(":")[0]) == (
        "runtime.failed",
        "the agentscope runtime has no structured output",
    )
    assert fake_provider.requests == []


async def test_agentscope_writes_nothing_of_its_own(
    fake_provider: ScriptedModel, caplog: pytest.LogCaptureFixture
) -> None:
    fake_provider.script(Turn.error("bad temperature", status=400))
    recorder = Recorder()
    runtime = runtime_for(fake_provider)
    with caplog.at_level(logging.WARNING):
        try:
            await runtime.execute(context(recorder, AiRequest(message="hi")), recorder.session)
        finally:
            await runtime.aclose()
    assert recorder.terminal().error.message == "API returned 400: bad temperature"
    # AgentScope's warning goes where the process's logging sends it, not onto the console by itself.
    assert any(record.name == "as" for record in caplog.records)
    agentscope_logger = logging.getLogger("as")
    assert (agentscope_logger.handlers, agentscope_logger.propagate) == ([], True)
