"""Hosting a user's own AgentScope `Agent`: its tools pass the choke point, its answer streams."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from agentscope.agent import Agent
from agentscope.credential import OpenAICredential
from agentscope.message import TextBlock
from agentscope.model import OpenAIChatModel
from agentscope.permission import PermissionBehavior, PermissionDecision, PermissionRule
from agentscope.tool import FunctionTool, ToolChunk, Toolkit
from pydantic import SecretStr

from atmosphere.runtimes.agentscope import AgentScopeAgentRuntime
from atmosphere.sdk import AiRequest, ChatMessage
from atmosphere.sdk.runtime import RuntimeConfig, ToolCallRequest, ToolRunner, ToolSpec
from atmosphere.testing.model_turns import ToolCallScript, Turn
from atmosphere.testing.runtime_contract import Recorder, context
from atmosphere.testing.scripted_model import ScriptedModel

ALLOW = PermissionDecision(behavior=PermissionBehavior.ALLOW, message="allowed")
USER_MODELS: list[OpenAIChatModel] = []


@pytest.fixture(autouse=True)
async def _close_user_models() -> AsyncIterator[None]:
    """The users' models own their clients: closed after each test, as their owner would."""
    yield
    while USER_MODELS:
        await USER_MODELS.pop().client.close()


def user_model(provider: ScriptedModel) -> OpenAIChatModel:
    """The model an AgentScope user configures: here, the test's provider."""
    credential = OpenAICredential(api_key=SecretStr("user-key"), base_url=provider.base_url)
    model = OpenAIChatModel(credential=credential, model="user-model", max_retries=0)
    USER_MODELS.append(model)
    return model


def weather_agent(provider: ScriptedModel, ran: list[str], permission: PermissionDecision | None = ALLOW) -> Agent:
    """A real AgentScope agent with a real function tool of its own."""

    def get_weather(city: str) -> ToolChunk:
        """Current weather for a city.

        Args:
            city: The city's name.
        """
        ran.append(city)
        return ToolChunk(content=[TextBlock(text=f"sunny in {city}")])

    toolkit = Toolkit(tools=[FunctionTool(get_weather, permission=permission)])
    return Agent(name="weather", system_prompt="You report the weather.", model=user_model(provider), toolkit=toolkit)


def runtime_for(provider: ScriptedModel) -> AgentScopeAgentRuntime:
    return AgentScopeAgentRuntime(RuntimeConfig(base_url=provider.base_url, model="fake-model", stall_timeout=5.0))


async def host(
    provider: ScriptedModel,
    agent: Agent,
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


def through_local(recorder: Recorder, edit: dict[str, object] | None = None) -> ToolRunner:
    """A choke point that lets every call through to the tool (`local`), as an approver may have edited it."""

    async def run_tool(call: ToolCallRequest) -> str:
        recorder.tool_calls.append(call)
        assert call.local is not None
        return await call.local(json.dumps(edit) if edit is not None else call.arguments_json)

    return run_tool


def refusing(recorder: Recorder, text: str = "Error: denied") -> ToolRunner:
    """A choke point whose gates refuse every call: `local` is never called."""

    async def run_tool(call: ToolCallRequest) -> str:
        recorder.tool_calls.append(call)
        return text

    return run_tool


def said(message: Mapping[str, Any]) -> tuple[object, object]:
    """A message AgentScope's own formatter wrote, as (role, text)."""
    content = message["content"]
    if isinstance(content, list):
        content = "".join(part["text"] for part in content if part.get("type") == "text")
    return message["role"], content


def conversation(request: Mapping[str, Any]) -> list[tuple[object, object]]:
    """The messages of a request, without the runtime-state hints the agent injects of its own accord."""
    return [m for m in map(said, request["messages"]) if not str(m[1]).startswith("<system-reminder>")]


def test_an_agentscope_agent_is_hosted(fake_provider: ScriptedModel) -> None:
    runtime = AgentScopeAgentRuntime(RuntimeConfig(base_url="http://127.0.0.1:1/v1"))
    agent = weather_agent(fake_provider, [])
    assert AgentScopeAgentRuntime.hosts(agent)
    assert not AgentScopeAgentRuntime.hosts(object())
    [spec] = runtime.native_tools(agent)
    assert spec == ToolSpec(
        name="get_weather",
        description="Current weather for a city.",
        parameters={
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name."}},
            "required": ["city"],
        },
    )


async def test_the_agents_tool_runs_only_through_the_choke_point(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "Paris"}, call_id="call_p")),
        Turn.text("It is sunny in Paris.", usage=(20, 7)),
    )
    ran: list[str] = []
    recorder = Recorder()
    await host(fake_provider, weather_agent(fake_provider, ran), recorder, through_local(recorder))
    [call] = recorder.tool_calls
    assert (call.call_id, call.name, json.loads(call.arguments_json)) == ("call_p", "get_weather", {"city": "Paris"})
    assert ran == ["Paris"]
    first, second = fake_provider.requests
    assert first["model"] == "user-model"  # the agent's own model object runs it
    assert fake_provider.headers[0]["authorization"] == "Bearer user-key"
    assert conversation(first) == [("system", "You report the weather."), ("user", "Weather in Paris?")]
    tool_result = second["messages"][-1]
    assert (tool_result["role"], tool_result["tool_call_id"], tool_result["content"]) == (
        "tool",
        "call_p",
        "sunny in Paris",
    )
    assert recorder.text() == "It is sunny in Paris."
    assert recorder.kinds().count("text_delta") >= 2
    deltas = [e.tool_call_delta for e in recorder.events if e.WhichOneof("kind") == "tool_call_delta"]
    assert json.loads("".join(d.arguments_fragment for d in deltas)) == {"city": "Paris"}
    # One report per model round: the tool round's, the answer's.
    usages = [e.usage for e in recorder.events if e.WhichOneof("kind") == "usage"]
    assert [(u.input_tokens, u.output_tokens, u.model) for u in usages] == [
        (10, 5, "user-model"),
        (20, 7, "user-model"),
    ]
    assert recorder.kinds()[-1] == "complete"


async def test_a_refused_call_never_runs_the_tool(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "Paris"}, call_id="call_p")),
        Turn.text("I may not look."),
    )
    ran: list[str] = []
    recorder = Recorder()
    await host(fake_provider, weather_agent(fake_provider, ran), recorder, refusing(recorder))
    assert [c.name for c in recorder.tool_calls] == ["get_weather"]
    assert ran == []
    assert fake_provider.requests[1]["messages"][-1]["content"] == "Error: denied"
    assert recorder.text() == "I may not look."
    assert recorder.terminal().WhichOneof("kind") == "complete"


async def test_a_tool_agentscope_would_ask_a_user_about_is_the_platforms_to_approve(
    fake_provider: ScriptedModel,
) -> None:
    # AgentScope parks a reply on a custom tool nobody allowed; hosted, the choke point approves instead.
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "Paris"}, call_id="call_p")),
        Turn.text("Approved and done."),
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "Paris"}, call_id="call_q")),
        Turn.text("Not approved."),
    )
    ran: list[str] = []
    agent = weather_agent(fake_provider, ran, permission=None)
    recorder = Recorder()
    # The approver edited the arguments: the tool runs with what was approved.
    await host(fake_provider, agent, recorder, through_local(recorder, edit={"city": "Lyon"}))
    assert ran == ["Lyon"]
    assert fake_provider.requests[1]["messages"][-1]["content"] == "sunny in Lyon"
    assert recorder.text() == "Approved and done."

    recorder = Recorder()
    denial = "Error: the call to get_weather was not approved: too far"
    await host(fake_provider, agent, recorder, refusing(recorder, denial))
    assert ran == ["Lyon"]
    assert fake_provider.requests[3]["messages"][-1]["content"] == denial
    assert recorder.terminal().WhichOneof("kind") == "complete"


async def test_what_a_failing_tool_says_reaches_the_model_through_the_choke_point(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("transfer", {"amount": 500}, call_id="call_t")),
        Turn.text("Please confirm."),
    )

    def transfer(amount: int) -> ToolChunk:
        """Move money.

        Args:
            amount: Euros to move.
        """
        raise ValueError(f"{amount} EUR is over the daily limit")

    toolkit = Toolkit(tools=[FunctionTool(transfer, permission=ALLOW)])
    agent = Agent(name="bank", system_prompt="", model=user_model(fake_provider), toolkit=toolkit)
    recorder = Recorder()
    await host(fake_provider, agent, recorder, through_local(recorder))
    assert fake_provider.requests[1]["messages"][-1]["content"] == "Error: 500 EUR is over the daily limit"
    assert recorder.terminal().WhichOneof("kind") == "complete"


async def test_each_run_has_its_own_state_and_the_history_follows_the_prompt(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("Still sunny."), Turn.text("Rain."))
    agent = weather_agent(fake_provider, [])
    history = (ChatMessage("user", "Weather?"), ChatMessage("assistant", "Sunny."))
    recorder = Recorder()
    await host(fake_provider, agent, recorder, refusing(recorder), AiRequest(message="And now?", history=history))
    assert conversation(fake_provider.requests[0]) == [
        ("system", "You report the weather."),
        ("user", "Weather?"),
        ("assistant", "Sunny."),
        ("user", "And now?"),
    ]
    assert agent.state.context == []  # the object itself is untouched: it serves every conversation
    await host(fake_provider, agent, Recorder(), refusing(recorder), AiRequest(message="Tomorrow?"))
    assert conversation(fake_provider.requests[1]) == [
        ("system", "You report the weather."),
        ("user", "Tomorrow?"),
    ]


async def test_cancelling_a_hosted_run_closes_the_upstream_request(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.stalled("Thinking", seconds=30))
    recorder = Recorder()
    runtime = runtime_for(fake_provider)
    ctx = context(recorder, AiRequest(message="hi"), native=weather_agent(fake_provider, []))
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
        assert task.cancelled()
        await asyncio.wait_for(fake_provider.disconnected.wait(), 10.0)
        assert time.monotonic() - cancelled_at < 10.0  # the stall lasts 30 s; loose for a loaded machine
    finally:
        await runtime.aclose()


async def test_an_agents_own_ask_rule_ends_the_run_saying_what_to_do(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.tool_calls(ToolCallScript("get_weather", {"city": "Paris"}, call_id="call_p")))
    ran: list[str] = []
    agent = weather_agent(fake_provider, ran)
    rule = PermissionRule(tool_name="get_weather", rule_content=None, behavior=PermissionBehavior.ASK, source="test")
    agent.state.permission_context.ask_rules = {"get_weather": [rule]}
    recorder = Recorder()
    await host(fake_provider, agent, recorder, through_local(recorder))
    assert recorder.tool_calls == []
    assert ran == []
    error = recorder.terminal().error
    assert error.code == "runtime.failed"
    assert error.message.startswith("the AgentScope agent stopped to ask for a confirmation of get_weather")
