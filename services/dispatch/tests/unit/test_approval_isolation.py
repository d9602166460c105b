"""Approvals: each parallel call of a round has its own, and one outlives the client that was asked.

A decision travels on the run's control subject (`atmo.run.<id>.ctl`), answered by the worker
that holds the run, not by the connection that saw the question: a client that went away and
came back (a reloaded page, a new socket) reads the request again from the run's stream and
answers it there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from atmosphere.bus import Envelope, Headers, WorkItem, subjects
from atmosphere.bus.runs import follow_run
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.run.v1.run_pb2 import ApprovalDecision, Control, ControlAck, RunEvent, RunSubmission
from atmosphere.sdk import App, agent, tool
from atmosphere.testing import ToolCallScript, Turn, wait_until

from .conftest import Harness, kinds, request


@tool(requires_approval=True)
def wire_money(amount: int) -> str:
    """Send money (asks for approval)."""
    return "unused: the stand-in sandbox answers"


@agent(name="banker", tools=[wire_money], harness=[])
class Banker:
    """Moves money when a human agrees."""


APP = App(agents=[Banker])


def asked(events: list[RunEvent]) -> list[tuple[int, str]]:
    """The approval requests as (amount, approval id), in the order asked."""
    return [
        (json.loads(e.approval_required.arguments_json)["amount"], e.approval_required.approval_id)
        for e in events
        if e.HasField("approval_required")
    ]


async def decide(harness: Harness, approval_id: str, action: str, *, user: str = "") -> ControlAck:
    decision = ApprovalDecision(approval_id=approval_id, action=action)
    control = Control(run_id="r1", principal=Principal(user_id=user), approval=decision)
    return await harness.bus.request(subjects.run_control("r1"), control, ControlAck)


def amounts_run(harness: Harness) -> list[int]:
    return [json.loads(call.arguments_json)["amount"] for call in harness.tool_calls]


def ends_by_call(events: list[RunEvent]) -> dict[str, str]:
    """How each call ended: its result, or its error."""
    ends = {e.tool_result.call_id: e.tool_result.result for e in events if e.HasField("tool_result")}
    return ends | {e.tool_error.call_id: e.tool_error.error for e in events if e.HasField("tool_error")}


@pytest.mark.parametrize(
    "durable",
    [False, True],
    ids=["plain", "durable"],
)
async def test_each_parallel_call_gets_its_own_approval_and_each_answer_releases_only_its_call(
    harness: Harness, durable: bool
) -> None:
    await harness.serve_tools({"wire_money": "sent"})
    harness.provider.script(
        Turn.tool_calls(
            ToolCallScript("wire_money", {"amount": 5}, call_id="a"),
            ToolCallScript("wire_money", {"amount": 7}, call_id="b"),
            ToolCallScript("wire_money", {"amount": 5}, call_id="c"),  # the same arguments as "a"
        ),
        Turn.text("done"),
    )
    run = request("banker")
    executor = harness.executor(APP, durable=durable, owner="w1")
    item = WorkItem(Envelope(subjects.run_submit(run.agent), run, Headers()), stream_seq=1, delivered=1)
    task = asyncio.create_task(executor.on_work(item))

    async def all_asked() -> bool:
        return len(asked(harness.events())) == 3 or task.done()

    await wait_until(all_asked, what="three approval requests")
    if task.done():
        task.result()  # the run ended early: its error is the failure
        pytest.fail(f"the run ended before all three calls asked: {kinds(harness.events())}")
    requests = asked(harness.events())
    assert len({approval_id for _, approval_id in requests}) == 3  # one id per call, even for identical arguments
    # ... and each names its call, so a client tells the two identical ones apart.
    calls = sorted(e.approval_required.call_id for e in harness.events() if e.HasField("approval_required"))
    assert calls == ["a", "b", "c"]
    [seven] = [approval_id for amount, approval_id in requests if amount == 7]
    first_five, second_five = [approval_id for amount, approval_id in requests if amount == 5]

    assert (await decide(harness, seven, "approve")).accepted

    async def b_ran() -> bool:
        return "b" in ends_by_call(harness.events())

    await wait_until(b_ran, what="the approved call's result")
    assert amounts_run(harness) == [7]  # only the approved call ran; "a" and "c" still wait
    assert ends_by_call(harness.events()) == {"b": "sent"}

    again = await decide(harness, seven, "deny")
    assert not again.accepted  # an answered approval takes no second answer
    assert (await decide(harness, first_five, "deny")).accepted
    assert (await decide(harness, second_five, "approve")).accepted
    await asyncio.wait_for(task, 10)

    ends = ends_by_call(harness.events())
    cancelled = json.dumps({"status": "cancelled", "message": "Action cancelled by user"}, separators=(",", ":"))
    assert sorted([ends["a"], ends["c"]]) == sorted([cancelled, "sent"])  # one of the twins ran, one was denied
    assert amounts_run(harness) == [7, 5]
    assert kinds(harness.events())[-1] == "complete"


@tool
def look(n: int) -> str:
    """Look something up (no approval)."""
    return "unused"


@agent(name="looker", tools=[look], harness=[])
class Looker:
    """Looks up several things at once."""


async def test_a_durable_run_takes_several_tool_calls_in_one_round(harness: Harness) -> None:
    await harness.serve_tools({"look": "seen"})
    calls = [ToolCallScript("look", {"n": n}, call_id=f"c{n}") for n in range(3)]
    harness.provider.script(Turn.tool_calls(*calls), Turn.text("ok"))
    run = request("looker")
    item = WorkItem(Envelope(subjects.run_submit(run.agent), run, Headers()), stream_seq=1, delivered=1)
    await harness.executor(App(agents=[Looker]), durable=True, owner="w1").on_work(item)
    assert kinds(harness.events()).count("tool_result") == 3
    assert kinds(harness.events())[-1] == "complete"


async def test_an_approval_is_answered_after_the_client_went_away_and_came_back(harness: Harness) -> None:
    await harness.serve_tools({"wire_money": "sent"})
    harness.provider.script(Turn.tool_calls(ToolCallScript("wire_money", {"amount": 5})), Turn.text("Sent it."))
    run: RunSubmission = request("banker")
    run.principal.user_id = "alice"
    task = asyncio.create_task(harness.executor(APP).execute(run))

    async def started() -> bool:
        return bool(harness.events())

    await wait_until(started, what="the run's first event")
    # The first client follows the run until it is asked, then goes away without answering.
    first = follow_run(harness.bus, "r1", after_seq=1)
    seen_first: list[str] = []
    async with contextlib.aclosing(first):
        async for event in first:
            seen_first.append(event.WhichOneof("kind") or "")
            if event.HasField("approval_required"):
                break
    assert seen_first[-1] == "approval_required"
    assert not task.done()  # the run waits for its answer, not for that client

    # A new connection of the same user reads the run from the start, finds the question, answers it.
    answered: list[str] = []
    second = follow_run(harness.bus, "r1", after_seq=1)
    async with contextlib.aclosing(second):
        async for event in second:
            answered.append(event.WhichOneof("kind") or "")
            if event.HasField("approval_required"):
                assert (await decide(harness, event.approval_required.approval_id, "approve", user="alice")).accepted
    await asyncio.wait_for(task, 10)
    assert answered[: len(seen_first)] == seen_first  # the same events again, the question included
    assert answered[-1] == "complete"
    assert "tool_result" in answered
    assert amounts_run(harness) == [5]


async def test_an_approval_is_not_answered_by_another_user(harness: Harness) -> None:
    await harness.serve_tools({"wire_money": "sent"})
    harness.provider.script(Turn.tool_calls(ToolCallScript("wire_money", {"amount": 5})), Turn.text("ok"))
    run = request("banker")
    run.principal.user_id = "alice"
    task = asyncio.create_task(harness.executor(APP, approval_timeout=5).execute(run))

    async def asked_once() -> bool:
        return len(asked(harness.events())) == 1

    await wait_until(asked_once, what="the approval request")
    [(_, approval_id)] = asked(harness.events())
    assert not (await decide(harness, approval_id, "approve", user="mallory")).accepted
    assert (await decide(harness, approval_id, "approve", user="alice")).accepted
    await asyncio.wait_for(task, 10)
    assert amounts_run(harness) == [5]
