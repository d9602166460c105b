"""Every tool call that started ends with a frame: a denied, timed-out or answered approval too."""

from __future__ import annotations

import asyncio
import json

import pytest

from atmosphere.bus import subjects
from atmosphere.contracts.run.v1.run_pb2 import ApprovalDecision, Control, ControlAck, RunEvent
from atmosphere.sdk import App, agent, tool
from atmosphere.testing import ToolCallScript, Turn, wait_until

from .conftest import Harness, kinds, request

CANCELLED = {"status": "cancelled", "message": "Action cancelled by user"}


@tool(requires_approval=True)
def wire_money(amount: int) -> str:
    """Send money (asks for approval)."""
    return "unused: the stand-in sandbox answers"


@agent(name="banker", tools=[wire_money])
class Banker:
    """Moves money when a human agrees."""


APP = App(agents=[Banker])


async def decide(harness: Harness, action: str, payload: str = "") -> None:
    async def pending() -> bool:
        return "approval_required" in kinds(harness.events())

    await wait_until(pending, what="the approval request")
    [approval] = [e.approval_required for e in harness.events() if e.WhichOneof("kind") == "approval_required"]
    decision = ApprovalDecision(approval_id=approval.approval_id, action=action, payload_json=payload)
    ack = await harness.bus.request(subjects.run_control("r1"), Control(run_id="r1", approval=decision), ControlAck)
    assert ack.accepted


async def run_with(harness: Harness, action: str | None, payload: str = "", **options: float) -> list[RunEvent]:
    """One run of `banker` whose approval is answered with `action` (None: never answered)."""
    await harness.serve_tools({"wire_money": "sent"})
    harness.provider.script(Turn.tool_calls(ToolCallScript("wire_money", {"amount": 5})), Turn.text("done"))
    run = harness.executor(APP, **options).execute(request("banker"))
    if action is None:
        await run
    else:
        await asyncio.gather(run, decide(harness, action, payload))
    return harness.events()


def after_start(events: list[RunEvent]) -> RunEvent:
    """The first tool frame after `tool-start` and `approval-required`."""
    found = kinds(events)
    start = found.index("tool_start")
    assert found[start + 1] == "approval_required"
    return events[start + 2]


@pytest.mark.parametrize(
    ("action", "payload"),
    [("deny", ""), ("approve", "not json"), ("approve", "[1, 2]"), ("respond", ""), ("nonsense", "")],
)
async def test_a_refused_call_ends_with_a_tool_error_that_says_what_the_model_got(
    harness: Harness, action: str, payload: str
) -> None:
    events = await run_with(harness, action, payload)
    ended = after_start(events)
    assert ended.WhichOneof("kind") == "tool_error"
    assert (ended.tool_error.tool_name, json.loads(ended.tool_error.error)) == ("wire_money", CANCELLED)
    assert harness.tool_calls == []  # the tool never ran
    assert json.loads(harness.provider.requests[-1]["messages"][-1]["content"]) == CANCELLED
    assert kinds(events)[-1] == "complete"


async def test_a_timed_out_approval_ends_with_a_tool_error(harness: Harness) -> None:
    events = await run_with(harness, None, approval_timeout=0.2)
    ended = after_start(events)
    assert ended.WhichOneof("kind") == "tool_error"
    assert json.loads(ended.tool_error.error) == {"status": "timeout", "message": "Approval timed out"}
    assert harness.tool_calls == []


async def test_a_reviewers_response_is_the_tool_result_the_model_and_the_client_see(harness: Harness) -> None:
    events = await run_with(harness, "respond", '{"sent": false, "why": "limit"}')
    ended = after_start(events)
    assert ended.WhichOneof("kind") == "tool_result"
    assert (ended.tool_result.tool_name, ended.tool_result.result) == ("wire_money", '{"sent": false, "why": "limit"}')
    assert harness.tool_calls == []  # answered in the tool's place
    assert harness.provider.requests[-1]["messages"][-1]["content"] == '{"sent": false, "why": "limit"}'


async def test_an_approved_call_still_ends_with_its_own_result(harness: Harness) -> None:
    events = await run_with(harness, "approve")
    ended = after_start(events)
    assert (ended.WhichOneof("kind"), ended.tool_result.result) == ("tool_result", "sent")
    assert len(harness.tool_calls) == 1
