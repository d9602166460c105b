"""A run of one tool call and no model (an app tool a door exposes): the choke point, then the result."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest

from atmosphere.bus import Envelope, Headers, WorkItem, subjects
from atmosphere.bus.errors import ToolCallFailedError, ToolCallRefusedError
from atmosphere.bus.runs import TOOL_CALL_METADATA_KEY
from atmosphere.contracts.run.v1.run_pb2 import (
    ApprovalDecision,
    Cancel,
    Control,
    ControlAck,
    RunEvent,
    RunSubmission,
)
from atmosphere.dispatch.direct_call import requested_call
from atmosphere.dispatch.handlers import agent_descriptors
from atmosphere.dispatch.harness import AgentHarness
from atmosphere.dispatch.model_side import ModelSide
from atmosphere.dispatch.tool_errors import INTERRUPTED
from atmosphere.sdk import AiBudget, App, StreamingSession, agent, prompt, tool
from atmosphere.sdk import Harness as HarnessFeature
from atmosphere.sdk.builtin_tools import WRITE_TODOS
from atmosphere.testing import wait_until

from .conftest import Harness, kinds, request


@tool(idempotent=True)
def get_weather(city: str) -> str:
    """Current weather for a city."""
    return "unused: the stand-in sandbox answers"


@tool(requires_approval=True)
def delete_note(title: str) -> str:
    """Delete a note (asks first)."""
    return "unused"


@tool
def slow(seconds: int) -> str:
    """Takes its time."""
    return "unused"


@agent(name="weather", tools=[get_weather, delete_note, slow], harness=[HarnessFeature.PLANNING])
class Weather:
    """Its `@prompt` must never run for a direct call."""

    prompted = 0

    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        type(self).prompted += 1
        await session.send("the prompt ran")


@agent(name="other", tools=[slow])
class Other:
    """Has its own tools, not weather's."""


@agent(name="hurried", tools=[slow], budget=AiBudget(max_wall_clock=0.3))
class Hurried:
    """A wall clock shorter than its tool."""


APP = App(agents=[Weather, Other, Hurried])


def direct(agent_name: str, name: str, arguments: Any, *, run_id: str = "r1", message: str = "") -> RunSubmission:
    run = request(agent_name, message or f"{name} {json.dumps(arguments)}", run_id=run_id)
    run.metadata[TOOL_CALL_METADATA_KEY] = json.dumps({"name": name, "arguments": arguments})
    return run


def terminal(events: list[RunEvent]) -> RunEvent:
    return events[-1]


async def test_a_direct_call_runs_the_tool_through_the_choke_point_and_answers_with_its_result(
    harness: Harness,
) -> None:
    await harness.serve_tools({"get_weather": "sunny, 21 C"})
    Weather.prompted = 0
    await harness.executor(APP).execute(direct("weather", "get_weather", {"city": "Paris"}))
    events = harness.events()
    assert kinds(events) == ["tool_start", "tool_result", "text_delta", "complete"]
    assert events[-2].text_delta.text == "sunny, 21 C"
    assert [(c.name, json.loads(c.arguments_json)) for c in harness.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert [c.tool_name for c in harness.policy.checks] == ["get_weather"]  # governance's call_tool check
    assert len(harness.policy.admissions) == 1  # admitted like any run
    assert harness.policy.ended
    assert harness.policy.ended[0].succeeded
    assert harness.provider.requests == []  # no model
    assert Weather.prompted == 0


async def test_a_call_a_policy_denies_ends_the_run_with_the_denial_and_never_runs(harness: Harness) -> None:
    await harness.serve_tools({"get_weather": "sunny"})
    harness.policy.tools = False
    await harness.executor(APP).execute(direct("weather", "get_weather", {"city": "Paris"}))
    end = terminal(harness.events())
    assert end.error.code == ToolCallFailedError.code
    assert end.error.message == "Tool get_weather denied by policy 'test-policy': not allowed here"
    assert harness.tool_calls == []


async def test_a_failing_tool_ends_the_run_with_its_text(harness: Harness) -> None:
    await harness.serve_tools({"get_weather": "Error: no such city"})
    await harness.executor(APP).execute(direct("weather", "get_weather", {"city": "Atlantis"}))
    events = harness.events()
    assert "tool_error" in kinds(events)
    assert (terminal(events).error.code, terminal(events).error.message) == (ToolCallFailedError.code, "no such city")


async def test_arguments_that_do_not_fit_the_schema_are_a_clear_error(harness: Harness) -> None:
    await harness.serve_tools({"get_weather": "sunny"})
    await harness.executor(APP).execute(direct("weather", "get_weather", {"town": "Paris"}))
    end = terminal(harness.events())
    assert end.error.code == ToolCallFailedError.code
    assert end.error.message.startswith("Invalid arguments for the tool 'get_weather': ")
    assert "city" in end.error.message
    assert harness.tool_calls == []


@pytest.mark.parametrize(
    ("agent_name", "name", "arguments", "why"),
    [
        ("other", "get_weather", {"city": "Paris"}, "has no tool 'get_weather'"),  # another agent's tool
        ("weather", WRITE_TODOS.name, {"todos": []}, f"has no tool '{WRITE_TODOS.name}'"),  # a harness tool
        ("weather", "code_exec", {"code": "1"}, "has no tool 'code_exec'"),  # the sandbox's own
        ("weather", "get_weather", ["Paris"], "must be a JSON object"),
    ],
)
async def test_only_the_agents_own_tools_may_be_called_directly(
    harness: Harness, agent_name: str, name: str, arguments: Any, why: str
) -> None:
    await harness.serve_tools({"get_weather": "sunny"})
    await harness.executor(APP).execute(direct(agent_name, name, arguments))
    events = harness.events()
    assert kinds(events) == ["error"]
    assert terminal(events).error.code == ToolCallRefusedError.code
    assert why in terminal(events).error.message
    assert harness.tool_calls == []
    assert harness.policy.checks == []


async def test_an_unreadable_call_is_refused() -> None:
    run = request("weather")
    run.metadata[TOOL_CALL_METADATA_KEY] = "{not json"
    with pytest.raises(ToolCallRefusedError, match="unreadable"):
        requested_call(run, {"get_weather"})


async def test_a_policy_that_rewrites_the_input_refuses_the_call(harness: Harness) -> None:
    await harness.serve_tools({"get_weather": "sunny"})
    harness.policy.rewrite = "get_weather [REDACTED]"
    await harness.executor(APP).execute(direct("weather", "get_weather", {"city": "jane@example.com"}))
    end = terminal(harness.events())
    assert end.error.code == ToolCallRefusedError.code
    assert "rewrote this tool call's input" in end.error.message
    assert harness.tool_calls == []


@pytest.mark.parametrize(("action", "ran"), [("approve", True), ("deny", False)])
async def test_a_call_needing_approval_asks_and_runs_only_when_approved(
    harness: Harness, action: str, ran: bool
) -> None:
    await harness.serve_tools({"delete_note": "deleted"})

    async def decide() -> None:
        async def pending() -> bool:
            return "approval_required" in kinds(harness.events())

        await wait_until(pending, what="the approval request")
        [asked] = [e.approval_required for e in harness.events() if e.WhichOneof("kind") == "approval_required"]
        decision = ApprovalDecision(approval_id=asked.approval_id, action=action)
        control = Control(run_id="r1", approval=decision)
        assert (await harness.bus.request(subjects.run_control("r1"), control, ControlAck)).accepted

    run = harness.executor(APP).execute(direct("weather", "delete_note", {"title": "groceries"}))
    await asyncio.gather(run, decide())
    end = terminal(harness.events())
    assert (len(harness.tool_calls) == 1) is ran
    if ran:
        assert end.WhichOneof("kind") == "complete"
    else:
        assert end.error.code == ToolCallFailedError.code
        assert end.error.message == "Action cancelled by user"


async def test_the_budgets_wall_clock_bounds_the_call(harness: Harness) -> None:
    await harness.serve_tools({"slow": "done"}, delay=2.0)
    await harness.executor(APP).execute(direct("hurried", "slow", {"seconds": 2}))
    end = terminal(harness.events())
    assert end.error.code == "budget.exceeded"


def test_the_descriptor_names_the_agents_own_tools_apart_from_its_harness() -> None:
    harnesses = {"weather": AgentHarness(tools={WRITE_TODOS.name: WRITE_TODOS})}
    [weather, *_] = agent_descriptors(APP, ModelSide(None), harnesses)
    assert list(weather.app_tools) == ["get_weather", "delete_note", "slow"]
    assert WRITE_TODOS.name in weather.tools
    assert WRITE_TODOS.name not in weather.app_tools


async def test_a_cancelled_call_ends_the_run_cancelled(harness: Harness) -> None:
    await harness.serve_tools({"slow": "done"}, delay=5.0)
    run = asyncio.create_task(harness.executor(APP).execute(direct("weather", "slow", {"seconds": 5})))

    async def running() -> bool:
        return len(harness.tool_calls) == 1

    await wait_until(running, what="the call to start")
    control = Control(run_id="r1", cancel=Cancel(reason="the MCP client cancelled the call"))
    assert (await harness.bus.request(subjects.run_control("r1"), control, ControlAck)).accepted
    await run
    assert terminal(harness.events()).error.code == "run.cancelled"


def work_item(run: RunSubmission, delivered: int) -> WorkItem[RunSubmission]:
    return WorkItem(Envelope(subjects.run_submit(run.agent), run, Headers()), stream_seq=1, delivered=delivered)


@pytest.mark.parametrize(("tool", "runs"), [("slow", 1), ("get_weather", 2)], ids=["once", "idempotent"])
async def test_a_durable_call_whose_worker_died_is_reported_interrupted_or_run_again(
    harness: Harness, tool: str, runs: int
) -> None:
    await harness.serve_tools({tool: "done"}, delay=1.0)
    run = direct("weather", tool, {"seconds": 1} if tool == "slow" else {"city": "Paris"})
    first = asyncio.create_task(harness.executor(APP, durable=True, owner="w1").on_work(work_item(run, 1)))

    async def started() -> bool:
        return len(harness.tool_calls) == 1

    await wait_until(started, timeout=10, what="the call to start")
    first.cancel()  # the worker dies inside the call
    with contextlib.suppress(asyncio.CancelledError):
        await first
    await harness.executor(APP, durable=True, owner="w2").on_work(work_item(run, 2))
    assert len(harness.tool_calls) == runs
    events = harness.events()
    assert kinds(events).count("tool_start") == 1  # not sent again
    end = terminal(events)
    if runs == 1:  # never silently repeated
        assert end.error.code == ToolCallFailedError.code
        assert end.error.message == INTERRUPTED.format(name=tool).removeprefix("Error: ")
    else:
        assert end.WhichOneof("kind") == "complete"


async def test_a_direct_call_needs_no_model_runtime(harness: Harness) -> None:
    await harness.serve_tools({"get_weather": "sunny"})
    await harness.executor(APP, with_runtime=False).execute(direct("weather", "get_weather", {"city": "Oslo"}))
    events = harness.events()
    assert kinds(events) == ["tool_start", "tool_result", "text_delta", "complete"]
