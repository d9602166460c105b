"""Hosting a user's own `pydantic_ai.Agent`: its tools pass the choke point, its answer streams."""

from __future__ import annotations

import asyncio
import json
import time

from pydantic_ai import Agent, ModelRetry
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai_compatible import OpenAICompatibleProvider

from atmosphere.runtimes.pydantic_ai import PydanticAiAgentRuntime
from atmosphere.sdk import AiRequest, ChatMessage
from atmosphere.sdk.runtime import RuntimeConfig, ToolCallRequest, ToolRunner, ToolSpec
from atmosphere.testing.model_turns import ToolCallScript, Turn
from atmosphere.testing.runtime_contract import Recorder, context
from atmosphere.testing.scripted_model import ScriptedModel


def weather_agent(ran: list[str]) -> Agent[None, str]:
    """A real PydanticAI agent with a real function tool (no model: the platform's is used)."""
    agent = Agent(instructions="You report the weather.", name="weather")

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """Current weather for a city.

        Args:
            city: The city's name.
        """
        ran.append(city)
        return f"sunny in {city}"

    return agent


def runtime_for(provider: ScriptedModel) -> PydanticAiAgentRuntime:
    return PydanticAiAgentRuntime(RuntimeConfig(base_url=provider.base_url, model="fake-model", stall_timeout=5.0))


async def host(
    provider: ScriptedModel,
    agent: Agent[None, str],
    recorder: Recorder,
    run_tool: ToolRunner,
    request: AiRequest | None = None,
) -> None:
    runtime = runtime_for(provider)
    try:
        ctx = context(recorder, request or AiRequest(message="Weather in Paris?"), native=agent, run_tool=run_tool)
        await runtime.execute(ctx, recorder.session)
    finally:
        await runtime.aclose()


def through_local(recorder: Recorder) -> ToolRunner:
    """A choke point that lets every call through to the tool (`local`), recording it."""

    async def run_tool(call: ToolCallRequest) -> str:
        recorder.tool_calls.append(call)
        assert call.local is not None
        return await call.local(call.arguments_json)

    return run_tool


def refusing(recorder: Recorder) -> ToolRunner:
    """A choke point whose gates refuse every call: `local` is never called."""

    async def run_tool(call: ToolCallRequest) -> str:
        recorder.tool_calls.append(call)
        return "Error: denied"

    return run_tool


def test_a_pydantic_ai_agent_is_hosted() -> None:
    runtime = PydanticAiAgentRuntime(RuntimeConfig(base_url="http://127.0.0.1:1/v1"))
    assert PydanticAiAgentRuntime.hosts(Agent())
    assert not PydanticAiAgentRuntime.hosts(object())
    [spec] = runtime.native_tools(weather_agent([]))
    assert spec == ToolSpec(
        name="get_weather",
        description="Current weather for a city.",
        parameters={
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name."}},
            "required": ["city"],
            "additionalProperties": False,
        },
    )


async def test_the_agents_tool_runs_only_through_the_choke_point(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "Paris"}, call_id="call_p")),
        Turn.text("It is sunny in Paris.", usage=(20, 7)),
    )
    ran: list[str] = []
    recorder = Recorder()
    await host(fake_provider, weather_agent(ran), recorder, through_local(recorder))
    [call] = recorder.tool_calls
    assert (call.call_id, call.name, json.loads(call.arguments_json)) == ("call_p", "get_weather", {"city": "Paris"})
    assert ran == ["Paris"]
    first, second = fake_provider.requests
    assert first["model"] == "fake-model"
    assert first["messages"][0] == {"role": "system", "content": "You report the weather."}
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_p", "content": "sunny in Paris"}
    assert recorder.text() == "It is sunny in Paris."
    assert recorder.kinds().count("text_delta") >= 2
    # One report per model round, as the built-in runtime makes them: the tool round's, the answer's.
    usages = [e.usage for e in recorder.events if e.WhichOneof("kind") == "usage"]
    assert [(u.input_tokens, u.output_tokens, u.total_tokens) for u in usages] == [(10, 5, 15), (20, 7, 27)]
    assert recorder.kinds()[-2:] == ["usage", "complete"]


async def test_a_refused_call_never_runs_the_tool(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "Paris"}, call_id="call_p")),
        Turn.text("I may not look."),
    )
    ran: list[str] = []
    recorder = Recorder()
    await host(fake_provider, weather_agent(ran), recorder, refusing(recorder))
    assert [c.name for c in recorder.tool_calls] == ["get_weather"]
    assert ran == []
    assert fake_provider.requests[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_p",
        "content": "Error: denied",
    }
    assert recorder.terminal().WhichOneof("kind") == "complete"


async def test_arguments_the_tool_refuses_reach_the_model_as_an_error(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("get_weather", {"town": "Paris"}, call_id="call_p")),
        Turn.text("Sorry."),
    )
    ran: list[str] = []
    recorder = Recorder()
    await host(fake_provider, weather_agent(ran), recorder, through_local(recorder))
    assert [c.arguments_json for c in recorder.tool_calls] == ['{"town": "Paris"}']
    assert ran == []
    result = fake_provider.requests[1]["messages"][-1]["content"]
    assert result.startswith("Error: the arguments do not fit get_weather: city: Field required")


async def test_history_follows_the_agents_own_prompt(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("Still sunny."))
    agent = Agent(system_prompt="You are terse.", name="terse")
    history = (ChatMessage("user", "Weather?"), ChatMessage("assistant", "Sunny."))
    recorder = Recorder()
    await host(fake_provider, agent, recorder, refusing(recorder), AiRequest(message="And now?", history=history))
    assert fake_provider.requests[0]["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "And now?"},
    ]


async def test_cancelling_a_hosted_run_closes_the_upstream_request(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.stalled("Thinking", seconds=30))
    recorder = Recorder()
    runtime = runtime_for(fake_provider)
    ctx = context(recorder, AiRequest(message="hi"), native=weather_agent([]))
    task = asyncio.create_task(runtime.execute(ctx, recorder.session))
    try:
        for _ in range(200):
            if recorder.text():
                break
            await asyncio.sleep(0.01)
        assert recorder.text() == "Thinking"
        cancelled_at = time.monotonic()
        task.cancel()
        await asyncio.wait({task}, timeout=10.0)
        await asyncio.wait_for(fake_provider.disconnected.wait(), 10.0)
        assert time.monotonic() - cancelled_at < 10.0  # the stall lasts 30 s; loose for a loaded machine
    finally:
        await runtime.aclose()


async def test_what_the_tool_tells_the_model_reaches_it_through_the_choke_point(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("transfer", {"amount": 500}, call_id="call_t")),
        Turn.text("Please confirm."),
    )
    agent = Agent(name="bank")

    @agent.tool_plain(requires_approval=True)
    def transfer(amount: int) -> str:
        """Move money.

        Args:
            amount: Euros to move.
        """
        raise ModelRetry(f"{amount} EUR is over the daily limit")

    runtime = runtime_for(fake_provider)
    [spec] = runtime.native_tools(agent)
    assert spec.requires_approval  # PydanticAI's deferral becomes the platform's approval
    recorder = Recorder()
    await host(fake_provider, agent, recorder, through_local(recorder))
    assert fake_provider.requests[1]["messages"][-1]["content"] == (
        "Error: 500 EUR is over the daily limit\n\nFix the errors and try again."
    )
    assert recorder.terminal().WhichOneof("kind") == "complete"


async def test_a_model_object_of_the_agents_own_is_kept(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("ok"), Turn.text("ok"))
    provider = OpenAICompatibleProvider("own", base_url=fake_provider.base_url, api_key="own-key")
    recorder = Recorder()
    await host(fake_provider, Agent(OpenAIChatModel("own-model", provider=provider)), recorder, refusing(recorder))
    named = Agent("openai:gpt-4o", defer_model_check=True)  # a name is not followed: the platform's model runs it
    await host(fake_provider, named, recorder, refusing(recorder))
    assert [r["model"] for r in fake_provider.requests] == ["own-model", "fake-model"]
    assert fake_provider.headers[0]["authorization"] == "Bearer own-key"
    await provider.client.close()
