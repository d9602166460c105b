"""Hosting a user's own `ChatCompletionAgent`: its functions pass the choke point, its behaviour is honoured."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from openai import AsyncOpenAI
from semantic_kernel import Kernel
from semantic_kernel.agents import ChatCompletionAgent
from semantic_kernel.connectors.ai.function_choice_behavior import FunctionChoiceBehavior
from semantic_kernel.connectors.ai.open_ai import OpenAIChatCompletion
from semantic_kernel.filters import AutoFunctionInvocationContext, FilterTypes
from semantic_kernel.functions import KernelPlugin, kernel_function

from atmosphere.runtimes.semantic_kernel import SemanticKernelAgentRuntime
from atmosphere.sdk import AiRequest, ChatMessage
from atmosphere.sdk.runtime import RuntimeConfig, ToolCallRequest, ToolRunner, ToolSpec
from atmosphere.testing.model_turns import ToolCallScript, Turn
from atmosphere.testing.runtime_contract import Recorder, context
from atmosphere.testing.scripted_model import ScriptedModel


class WeatherFunctions:
    """A real plugin: SK builds its functions' schemas from these signatures."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    @kernel_function(name="get_weather", description="Current weather for a city.")
    def get_weather(self, city: str) -> str:
        self.ran.append(f"weather {city}")
        return f"sunny in {city}"

    @kernel_function(name="get_time", description="Local time in a city.")
    def get_time(self, city: str) -> str:
        self.ran.append(f"time {city}")
        raise RuntimeError("the clock is broken")


def weather_agent(functions: WeatherFunctions, **options: Any) -> ChatCompletionAgent:
    """A real SK agent with no chat service of its own: the platform's model serves it."""
    plugin = KernelPlugin.from_object("weather", functions)
    return ChatCompletionAgent(name="forecaster", instructions="You report the weather.", plugins=[plugin], **options)


def runtime_for(provider: ScriptedModel) -> SemanticKernelAgentRuntime:
    return SemanticKernelAgentRuntime(RuntimeConfig(base_url=provider.base_url, model="fake-model", stall_timeout=5.0))


async def host(
    provider: ScriptedModel,
    agent: ChatCompletionAgent,
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
    """A choke point that lets every call through to the function (`local`), reporting a failure as dispatch does."""

    async def run_tool(call: ToolCallRequest) -> str:
        recorder.tool_calls.append(call)
        assert call.local is not None
        try:
            return await call.local(call.arguments_json)
        except Exception as exc:
            return f"Error: {call.name} failed ({type(exc).__name__})"

    return run_tool


def refusing(recorder: Recorder) -> ToolRunner:
    """A choke point whose gates refuse every call: `local` is never called."""

    async def run_tool(call: ToolCallRequest) -> str:
        recorder.tool_calls.append(call)
        return "Error: denied"

    return run_tool


def test_a_chat_completion_agent_is_hosted_with_its_functions_named_as_the_model_sees_them() -> None:
    runtime = SemanticKernelAgentRuntime(RuntimeConfig(base_url="http://127.0.0.1:1/v1"))
    agent = weather_agent(WeatherFunctions())
    assert SemanticKernelAgentRuntime.hosts(agent)
    assert not SemanticKernelAgentRuntime.hosts(Kernel())  # a kernel is no agent: wrap it in one
    assert not SemanticKernelAgentRuntime.hosts(object())
    specs = {spec.name: spec for spec in runtime.native_tools(agent)}
    assert sorted(specs) == ["weather-get_time", "weather-get_weather"]
    assert specs["weather-get_weather"] == ToolSpec(
        name="weather-get_weather",
        description="Current weather for a city.",
        parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    )
    assert runtime.native_tools(object()) == ()


async def test_the_agents_function_runs_only_through_the_choke_point(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("weather-get_weather", {"city": "Paris"}, call_id="call_p")),
        Turn.text("It is sunny in Paris.", usage=(20, 7)),
    )
    functions = WeatherFunctions()
    recorder = Recorder()
    await host(fake_provider, weather_agent(functions), recorder, through_local(recorder))
    [call] = recorder.tool_calls
    assert (call.call_id, call.name, json.loads(call.arguments_json)) == (
        "call_p",
        "weather-get_weather",
        {"city": "Paris"},
    )
    assert functions.ran == ["weather Paris"]
    first, second = fake_provider.requests
    assert first["model"] == "fake-model"
    assert first["messages"][0] == {"role": "system", "content": "You report the weather.", "name": "forecaster"}
    assert sorted(t["function"]["name"] for t in first["tools"]) == ["weather-get_time", "weather-get_weather"]
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_p", "content": "sunny in Paris"}
    assert recorder.text() == "It is sunny in Paris."
    assert recorder.kinds().count("text_delta") >= 2
    # The platform's model streams the call's arguments as they come, under the name the model used.
    deltas = [e.tool_call_delta for e in recorder.events if e.WhichOneof("kind") == "tool_call_delta"]
    assert {(d.call_id, d.tool_name) for d in deltas} == {("call_p", "weather-get_weather")}
    assert json.loads("".join(d.arguments_fragment for d in deltas)) == {"city": "Paris"}
    # One report per model round, as the built-in runtime makes them: the tool round's, the answer's.
    usages = [e.usage for e in recorder.events if e.WhichOneof("kind") == "usage"]
    assert [(u.input_tokens, u.output_tokens, u.total_tokens, u.model) for u in usages] == [
        (10, 5, 15, "fake-model"),
        (20, 7, 27, "fake-model"),
    ]
    assert recorder.kinds()[-2:] == ["usage", "complete"]


async def test_a_refused_call_never_runs_the_function(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("weather-get_weather", {"city": "Paris"}, call_id="call_p")),
        Turn.text("I may not look."),
    )
    functions = WeatherFunctions()
    recorder = Recorder()
    await host(fake_provider, weather_agent(functions), recorder, refusing(recorder))
    assert [c.name for c in recorder.tool_calls] == ["weather-get_weather"]
    assert functions.ran == []
    assert fake_provider.requests[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_p",
        "content": "Error: denied",
    }
    assert recorder.text() == "I may not look."
    assert recorder.terminal().WhichOneof("kind") == "complete"


async def test_a_failing_function_fails_its_call_at_the_choke_point(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("weather-get_time", {"city": "Oslo"}, call_id="call_t")),
        Turn.text("No clock."),
    )
    functions = WeatherFunctions()
    recorder = Recorder()
    await host(fake_provider, weather_agent(functions), recorder, through_local(recorder))
    assert functions.ran == ["time Oslo"]
    # Raised to the choke point (which reports the call as failed), not handed over as SK's result text.
    result = fake_provider.requests[1]["messages"][-1]["content"]
    assert result == "Error: weather-get_time failed (RuntimeError)"


async def test_arguments_an_approver_edited_are_what_the_function_runs_with(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("weather-get_weather", {"city": "Paris"}, call_id="call_p")),
        Turn.tool_calls(ToolCallScript("weather-get_weather", {"city": "Paris"}, call_id="call_q")),
        Turn.text("Done."),
    )
    functions = WeatherFunctions()
    recorder = Recorder()
    edits = iter(['{"city": "Lyon"}', "{}"])

    async def editing(call: ToolCallRequest) -> str:
        recorder.tool_calls.append(call)
        assert call.local is not None
        return await call.local(next(edits))

    await host(fake_provider, weather_agent(functions), recorder, editing)
    assert functions.ran == ["weather Lyon"]
    assert fake_provider.requests[1]["messages"][-1]["content"] == "sunny in Lyon"
    # An edit that no longer fits the function is the model's to read, and the function never ran.
    assert fake_provider.requests[2]["messages"][-1]["content"].startswith("Error: Parameter city is required")


async def test_none_invoke_never_calls_a_function(fake_provider: ScriptedModel) -> None:
    # The model asks for a call anyway: under NoneInvoke, SK invokes nothing and asks no more.
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("weather-get_weather", {"city": "Paris"}, call_id="call_p")),
        Turn.text("never asked"),
    )
    functions = WeatherFunctions()
    recorder = Recorder()
    agent = weather_agent(functions, function_choice_behavior=FunctionChoiceBehavior.NoneInvoke())
    await host(fake_provider, agent, recorder, through_local(recorder))
    assert recorder.tool_calls == []
    assert functions.ran == []
    [request] = fake_provider.requests
    assert request["tool_choice"] == "none"
    assert recorder.terminal().WhichOneof("kind") == "complete"


async def test_required_forces_a_call_through_the_choke_point(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("weather-get_weather", {"city": "Rome"}, call_id="call_r")),
        Turn.text("never asked"),
    )
    functions = WeatherFunctions()
    recorder = Recorder()
    agent = weather_agent(functions, function_choice_behavior=FunctionChoiceBehavior.Required())
    await host(fake_provider, agent, recorder, through_local(recorder))
    assert [c.name for c in recorder.tool_calls] == ["weather-get_weather"]
    assert functions.ran == ["weather Rome"]
    # Required's one attempt is spent by the call: SK's streaming loop asks the model nothing more.
    [request] = fake_provider.requests
    assert request["tool_choice"] == "required"
    assert recorder.terminal().WhichOneof("kind") == "complete"


async def test_the_behaviours_filters_decide_what_is_offered_and_called(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("weather-get_time", {"city": "Oslo"}, call_id="call_t")),
        Turn.text("Only the weather."),
    )
    functions = WeatherFunctions()
    recorder = Recorder()
    behaviour = FunctionChoiceBehavior.Auto(filters={"included_functions": ["weather-get_weather"]})
    await host(
        fake_provider, weather_agent(functions, function_choice_behavior=behaviour), recorder, refusing(recorder)
    )
    first, second = fake_provider.requests
    assert [t["function"]["name"] for t in first["tools"]] == ["weather-get_weather"]
    # A call outside the filters is SK's to refuse before any filter runs: nothing ran, nothing was gated.
    assert recorder.tool_calls == []
    assert functions.ran == []
    assert "not part of the provided tools" in second["messages"][-1]["content"]


async def test_the_agents_own_filter_runs_before_the_gate(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("weather-get_weather", {"city": "Paris"}, call_id="call_p")),
        Turn.text("unused"),
    )
    functions = WeatherFunctions()
    agent = weather_agent(functions)
    seen: list[str] = []

    @agent.kernel.filter(FilterTypes.AUTO_FUNCTION_INVOCATION)
    async def stop_after_one(context: AutoFunctionInvocationContext, next: Any) -> None:
        seen.append(context.function.fully_qualified_name)
        await next(context)
        context.terminate = True  # the agent's own decision: the loop ends on this call's result

    recorder = Recorder()
    await host(fake_provider, agent, recorder, through_local(recorder))
    assert seen == ["weather-get_weather"]
    assert [c.name for c in recorder.tool_calls] == ["weather-get_weather"]
    assert functions.ran == ["weather Paris"]
    assert len(fake_provider.requests) == 1
    # The agent itself was not changed: a run gates a clone of its kernel.
    assert len(agent.kernel.auto_function_invocation_filters) == 1


async def test_instructions_come_first_then_the_requests_prompt_and_history(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("Still sunny."))
    history = (ChatMessage("user", "Weather?"), ChatMessage("assistant", "Sunny."))
    request = AiRequest(message="And now?", system_prompt="Be terse.", history=history)
    recorder = Recorder()
    await host(fake_provider, weather_agent(WeatherFunctions()), recorder, refusing(recorder), request)
    assert [(m["role"], m["content"]) for m in fake_provider.requests[0]["messages"]] == [
        ("system", "You report the weather."),
        ("system", "Be terse."),
        ("user", "Weather?"),
        ("assistant", "Sunny."),
        ("user", "And now?"),
    ]
    assert recorder.text() == "Still sunny."


async def test_the_agents_own_chat_service_is_kept(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("ok", usage=(3, 1)), Turn.text("ok"))
    client = AsyncOpenAI(base_url=fake_provider.base_url, api_key="own-key")
    own = OpenAIChatCompletion(ai_model_id="own-model", async_client=client)
    recorder = Recorder()
    await host(fake_provider, weather_agent(WeatherFunctions(), service=own), recorder, refusing(recorder))
    await host(fake_provider, weather_agent(WeatherFunctions()), recorder, refusing(recorder))
    assert [r["model"] for r in fake_provider.requests] == ["own-model", "fake-model"]
    assert fake_provider.headers[0]["authorization"] == "Bearer own-key"
    usage = next(e.usage for e in recorder.events if e.WhichOneof("kind") == "usage")
    assert (usage.input_tokens, usage.output_tokens, usage.model) == (3, 1, "own-model")
    await client.close()


async def test_cancelling_a_hosted_run_closes_the_upstream_request(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.stalled("Thinking", seconds=30))
    recorder = Recorder()
    runtime = runtime_for(fake_provider)
    ctx = context(recorder, AiRequest(message="hi"), native=weather_agent(WeatherFunctions()))
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
