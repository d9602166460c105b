"""AgentScope's task list mirrored into the platform's plan store, through `write_todos` at the choke point."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from agentscope.agent import Agent
from agentscope.credential import OpenAICredential
from agentscope.model import OpenAIChatModel
from agentscope.tool import TaskCreate, TaskList, TaskUpdate, Toolkit
from pydantic import SecretStr

from atmosphere.runtimes.agentscope import AgentScopeAgentRuntime
from atmosphere.sdk import AiRequest, ToolLoopPolicy
from atmosphere.sdk.builtin_tools import WRITE_TODOS
from atmosphere.sdk.runtime import RuntimeConfig, ToolCallRequest
from atmosphere.testing.model_turns import ToolCallScript, Turn
from atmosphere.testing.runtime_contract import WEATHER, Recorder, context
from atmosphere.testing.scripted_model import ScriptedModel

PLANNED = (
    Turn.tool_calls(ToolCallScript("TaskCreate", {"subject": "Find flights", "description": "Fares"}, call_id="c1")),
    Turn.tool_calls(ToolCallScript("TaskCreate", {"subject": "Book a hotel", "description": "Venue"}, call_id="c2")),
    Turn.tool_calls(ToolCallScript("TaskUpdate", {"task_id": "1", "status": "in_progress"}, call_id="c3")),
    Turn.tool_calls(ToolCallScript("TaskList", {}, call_id="c4")),
    Turn.tool_calls(ToolCallScript("TaskUpdate", {"task_id": "1", "status": "completed"}, call_id="c5")),
    Turn.tool_calls(ToolCallScript("TaskUpdate", {"task_id": "2", "status": "deleted"}, call_id="c6")),
    Turn.text("Flights found; no hotel needed."),
)
"""A model that plans two steps, starts the first, reads the list, finishes the first and drops the second."""
STORED = [
    [("Find flights", "pending")],
    [("Find flights", "pending"), ("Book a hotel", "pending")],
    [("Find flights", "in_progress"), ("Book a hotel", "pending")],
    [("Find flights", "completed"), ("Book a hotel", "pending")],
    [("Find flights", "completed"), ("Book a hotel", "abandoned")],
]
"""What the store gets: every change, in order (reading the list changes nothing)."""


def plans(recorder: Recorder) -> list[list[tuple[str, str]]]:
    """The plans sent to the store, in order: each as (content, status) steps."""
    return [
        [(step["content"], step["status"]) for step in json.loads(call.arguments_json)["todos"]]
        for call in recorder.tool_calls
        if call.name == WRITE_TODOS.name
    ]


def runtime_for(provider: ScriptedModel) -> AgentScopeAgentRuntime:
    return AgentScopeAgentRuntime(RuntimeConfig(base_url=provider.base_url, model="fake-model", stall_timeout=5.0))


async def test_the_task_list_of_a_planning_agent_reaches_the_plan_store(fake_provider: ScriptedModel) -> None:
    fake_provider.script(*PLANNED)
    recorder = Recorder()
    runtime = runtime_for(fake_provider)
    try:
        request = AiRequest(message="Plan my trip.")
        ctx = context(
            recorder, request, tools=(WEATHER,), store_tools=(WRITE_TODOS,), tool_loop=ToolLoopPolicy.max_iterations(8)
        )
        await runtime.execute(ctx, recorder.session)
    finally:
        await runtime.aclose()
    # AgentScope's task tools stand in for write_todos before the model: one plan surface.
    offered = [t["function"]["name"] for t in fake_provider.requests[0]["tools"]]
    assert sorted(offered) == ["TaskCreate", "TaskGet", "TaskList", "TaskUpdate", "get_weather"]
    assert plans(recorder) == STORED
    # Each plan goes through the choke point under the id of the call that changed it.
    assert [c.call_id for c in recorder.tool_calls] == ["c1-plan", "c2-plan", "c3-plan", "c5-plan", "c6-plan"]
    assert recorder.text() == "Flights found; no hotel needed."
    assert recorder.terminal().WhichOneof("kind") == "complete"


async def test_without_the_planning_harness_no_plan_is_written(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("Done."))
    recorder = Recorder()
    runtime = runtime_for(fake_provider)
    try:
        await runtime.execute(context(recorder, AiRequest(message="Hi."), tools=(WEATHER,)), recorder.session)
    finally:
        await runtime.aclose()
    assert [t["function"]["name"] for t in fake_provider.requests[0]["tools"]] == ["get_weather"]
    assert recorder.tool_calls == []


@pytest.fixture
async def planner(fake_provider: ScriptedModel) -> AsyncIterator[Agent]:
    """A user's own AgentScope agent keeping a task list, on its own model."""
    credential = OpenAICredential(api_key=SecretStr("user-key"), base_url=fake_provider.base_url)
    model = OpenAIChatModel(credential=credential, model="user-model", max_retries=0)
    yield Agent(
        name="planner",
        system_prompt="You plan trips.",
        model=model,
        toolkit=Toolkit(tools=[TaskCreate(), TaskUpdate(), TaskList()]),
    )
    await model.client.close()


async def test_a_hosted_agents_task_list_reaches_the_plan_store(fake_provider: ScriptedModel, planner: Agent) -> None:
    fake_provider.script(*PLANNED)
    recorder = Recorder()

    async def run_tool(call: ToolCallRequest) -> str:
        recorder.tool_calls.append(call)
        return "the plan, as a checklist"

    runtime = runtime_for(fake_provider)
    try:
        # The planning harness gives the hosted agent `write_todos` at the choke point.
        ctx = context(
            recorder, AiRequest(message="Plan my trip."), native=planner, store_tools=(WRITE_TODOS,), run_tool=run_tool
        )
        await runtime.execute(ctx, recorder.session)
    finally:
        await runtime.aclose()
    assert runtime.native_tools(planner) == ()  # its task tools are mirrored, not gated
    assert plans(recorder) == STORED
    assert planner.state.tasks_context.tasks == []  # the plan was the run's, not the shared object's
    assert recorder.terminal().WhichOneof("kind") == "complete"
