"""Hosting a user's own `crewai.Crew`: its tools pass the choke point, its agents report progress, its usage adds up."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest
from crewai import Agent, Crew, Task
from crewai.llms.providers.openai.completion import OpenAICompletion
from crewai.tools import BaseTool, tool

from atmosphere.bus.errors import NoStreamError
from atmosphere.runtimes.crewai import CrewAiAgentRuntime
from atmosphere.sdk import AiRequest, ChatMessage
from atmosphere.sdk.runtime import RuntimeConfig, ToolCallRequest, ToolRunner
from atmosphere.testing.model_turns import ToolCallScript, Turn
from atmosphere.testing.runtime_contract import Recorder, context
from atmosphere.testing.scripted_model import ScriptedModel

# CrewAI reads its own deprecated fields while it builds an agent (`function_calling_llm`): its
# warnings, not this adapter's, which the suite would otherwise turn into errors.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:crewai")


def weather_tool(ran: list[str]) -> BaseTool:
    """A real CrewAI tool that records each city it is run for."""

    @tool("get_weather")
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        ran.append(city)
        return f"sunny in {city}"

    return get_weather


def weather_crew(ran: list[str]) -> Crew:
    """One agent (no LLM of its own: the platform's runs it) with one tool, one task."""
    forecaster = Agent(
        role="forecaster", goal="Report the weather", backstory="You are terse.", tools=[weather_tool(ran)]
    )
    task = Task(description="{message}", expected_output="The weather", agent=forecaster)
    return Crew(agents=[forecaster], tasks=[task])


def runtime_for(provider: ScriptedModel) -> CrewAiAgentRuntime:
    return CrewAiAgentRuntime(RuntimeConfig(base_url=provider.base_url, model="fake-model", stall_timeout=5.0))


async def host(
    provider: ScriptedModel,
    crew: object,
    recorder: Recorder,
    run_tool: ToolRunner | None = None,
    request: AiRequest | None = None,
) -> None:
    runtime = runtime_for(provider)
    try:
        ctx = context(
            recorder,
            request or AiRequest(message="Weather in Paris?"),
            native=crew,
            run_tool=run_tool or recorder.run_tool,
        )
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


def test_a_crew_and_a_lone_agent_are_hosted_with_every_tool_listed() -> None:
    runtime = CrewAiAgentRuntime(RuntimeConfig(base_url="http://127.0.0.1:1/v1"))
    crew = weather_crew([])

    @tool("get_tide")
    def get_tide(port: str) -> str:
        """High tide at a port."""
        return port

    second = Agent(role="sailor", goal="Sail", backstory="You sail.")
    crew.agents.append(second)
    crew.tasks.append(Task(description="Tides", expected_output="Tides", agent=second, tools=[get_tide]))
    assert CrewAiAgentRuntime.hosts(crew)
    assert CrewAiAgentRuntime.hosts(second)
    assert not CrewAiAgentRuntime.hosts(object())
    weather, tide = runtime.native_tools(crew)
    assert (weather.name, weather.description, weather.parameters["properties"]) == (
        "get_weather",
        "Current weather for a city.",
        {"city": {"title": "City", "type": "string"}},
    )
    assert tide.name == "get_tide"
    assert runtime.native_tools(object()) == ()


async def test_the_crews_own_tool_runs_only_through_the_choke_point(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "Paris"}, call_id="call_p")),
        Turn.text("It is sunny in Paris."),
    )
    ran: list[str] = []
    recorder = Recorder()
    await host(fake_provider, weather_crew(ran), recorder, through_local(recorder))
    [call] = recorder.tool_calls
    assert (call.call_id, call.name, json.loads(call.arguments_json)) == ("call_p", "get_weather", {"city": "Paris"})
    assert ran == ["Paris"]
    first, second = fake_provider.requests
    assert first["model"] == "fake-model"
    assert "Weather in Paris?" in first["messages"][-1]["content"]  # the task's `{message}`
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_p", "content": "sunny in Paris"}
    assert recorder.text() == "It is sunny in Paris."
    assert recorder.terminal().WhichOneof("kind") == "complete"


async def test_a_refused_call_never_runs_the_tool(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "Paris"}, call_id="call_p")),
        Turn.text("I may not look."),
    )
    ran: list[str] = []
    recorder = Recorder()
    await host(fake_provider, weather_crew(ran), recorder, refusing(recorder))
    assert [c.name for c in recorder.tool_calls] == ["get_weather"]
    assert ran == []
    assert fake_provider.requests[1]["messages"][-1]["content"] == "Error: denied"
    assert recorder.text() == "I may not look."
    assert recorder.terminal().WhichOneof("kind") == "complete"


async def test_usage_is_reported_for_every_model_call_of_every_agent(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "Oslo"}), usage=(11, 2)),
        Turn.text("Cold.", usage=(13, 3)),
        Turn.text("Wear a coat.", usage=(17, 5)),
    )
    crew = weather_crew([])
    adviser = Agent(role="adviser", goal="Advise", backstory="You advise.")
    crew.agents.append(adviser)
    crew.tasks.append(Task(description="What to wear?", expected_output="Advice", agent=adviser))
    recorder = Recorder()
    await host(fake_provider, crew, recorder, through_local(recorder))
    usages = [e.usage for e in recorder.events if e.WhichOneof("kind") == "usage"]
    assert [(u.input_tokens, u.output_tokens) for u in usages] == [(11, 2), (13, 3), (17, 5)]
    assert (sum(u.input_tokens for u in usages), sum(u.total_tokens for u in usages)) == (41, 51)
    assert recorder.text() == "Wear a coat."  # the last task's answer; the forecaster's is in its step
    [done] = [
        json.loads(e.agent_step.data_json)
        for e in recorder.events
        if e.WhichOneof("kind") == "agent_step" and e.agent_step.step_name == "crewai.task.completed"
    ][:1]
    assert done == {"agent": "forecaster", "task": "{message}", "taskIndex": 1, "taskCount": 2, "output": "Cold."}


async def test_a_platform_failure_of_the_choke_point_ends_the_run_as_raised(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.tool_calls(ToolCallScript("get_weather", {"city": "Paris"})), Turn.text("never"))

    async def broken(call: ToolCallRequest) -> str:
        raise NoStreamError("ATMO_RUNS")

    ran: list[str] = []
    with pytest.raises(NoStreamError):
        await host(fake_provider, weather_crew(ran), Recorder(), broken)
    assert ran == []
    assert len(fake_provider.requests) == 1


async def test_an_agents_own_llm_is_kept_and_the_others_run_on_the_platforms(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("ok"), Turn.text("done"))
    own = OpenAICompletion(model="own-model", base_url=fake_provider.base_url, api_key="own-key")
    first = Agent(role="first", goal="Go", backstory="You go.", llm=own)
    second = Agent(role="second", goal="Go", backstory="You go.")
    crew = Crew(
        agents=[first, second],
        tasks=[
            Task(description="One", expected_output="ok", agent=first),
            Task(description="Two", expected_output="ok", agent=second),
        ],
    )
    recorder = Recorder()
    await host(fake_provider, crew, recorder)
    assert [r["model"] for r in fake_provider.requests] == ["own-model", "fake-model"]
    assert fake_provider.headers[0]["authorization"] == "Bearer own-key"
    # The crew's own LLM did not stream its answer; the answer is sent once the crew ends.
    assert recorder.text() == "done"


async def test_inputs_come_from_the_message_and_history_from_the_conversation(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("Sunny."))
    agent = Agent(role="forecaster", goal="Forecast {city}", backstory="You forecast.")
    crew = Crew(agents=[agent], tasks=[Task(description="Weather in {city}", expected_output="Weather", agent=agent)])
    history = (ChatMessage("user", "I like sun."), ChatMessage("assistant", "Noted."))
    request = AiRequest(message=json.dumps({"city": "Nice"}), history=history)
    recorder = Recorder()
    await host(fake_provider, crew, recorder, request=request)
    said = json.dumps(fake_provider.requests[0]["messages"])
    assert "Weather in Nice" in said
    assert "I like sun." in said  # CrewAI's crew_chat_messages: the conversation joins the task
    recorder = Recorder()
    await host(fake_provider, crew, recorder, request=AiRequest(message="Nice?"))
    assert recorder.terminal().error.message == (
        "the crew needs the input(s) city: send the message as a JSON object with them (message and history are given)"
    )


async def test_cancelling_a_hosted_run_closes_the_upstream_request(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.stalled("Thinking", seconds=30))
    recorder = Recorder()
    runtime = runtime_for(fake_provider)
    ctx = context(recorder, AiRequest(message="hi"), native=weather_crew([]))
    task = asyncio.create_task(runtime.execute(ctx, recorder.session))
    try:
        for _ in range(500):
            if recorder.text():
                break
            await asyncio.sleep(0.01)
        assert recorder.text() == "Thinking"
        cancelled_at = time.monotonic()
        task.cancel()
        await asyncio.wait({task}, timeout=10.0)
        await asyncio.wait_for(fake_provider.disconnected.wait(), 10.0)
        assert time.monotonic() - cancelled_at < 10.0  # the stall lasts 30 s; loose for a loaded machine
        assert task.cancelled()
    finally:
        await runtime.aclose()


async def test_crewai_writes_nothing_to_the_home_and_reports_nothing(
    fake_provider: ScriptedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("CREWAI_STORAGE_DIR", "CREWAI_DISABLE_TELEMETRY", "CREWAI_TRACING_ENABLED", "XDG_DATA_HOME"):
        monkeypatch.delenv(name, raising=False)
    fake_provider.script(Turn.text("ok"))
    runtime = runtime_for(fake_provider)  # sets CrewAI's defaults
    assert (os.environ["CREWAI_DISABLE_TELEMETRY"], os.environ["CREWAI_TRACING_ENABLED"]) == ("true", "false")
    storage = Path(os.environ["CREWAI_STORAGE_DIR"])
    await runtime.aclose()
    recorder = Recorder()
    await host(fake_provider, weather_crew([]), recorder)
    assert recorder.terminal().WhichOneof("kind") == "complete"
    assert list(home.iterdir()) == []
    assert (storage / "latest_kickoff_task_outputs.db").exists()
