"""The AG-UI door against a real stack: each event checked by the `ag-ui-protocol` SDK's own models.

A run with text, a tool call held for approval (an `interrupt` outcome, answered by `resume`),
a plan as state snapshot and delta, a denied tool, a second user, the limits, PII. The
official TypeScript client (`@ag-ui/client`) consumes the same runs in `test_agui_client.py`.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from ag_ui.core import Event, EventType, RunAgentInput, UserMessage
from pydantic import TypeAdapter

from atmosphere.bus.runs import last_event
from atmosphere.testing import ToolCallScript, Turn, wait_until

from .doors_stack import ADA, ADA_ECHO, BOB, EMAIL, MESSAGE_LIMIT, World, doors_world

pytestmark = pytest.mark.asyncio(loop_scope="module")

EVENTS: TypeAdapter[Any] = TypeAdapter(Event)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    async with doors_world(nats_url, tmp_path_factory.mktemp("agui-door")) as world:
        yield world


@pytest.fixture(autouse=True)
def fresh_script(world: World) -> Iterator[None]:
    with world.fresh():
        yield


def run_input(
    message: str | None, *, thread: str | None = None, resume: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    messages = [UserMessage(id=uuid.uuid4().hex, content=message)] if message is not None else []
    body = RunAgentInput(
        thread_id=thread or uuid.uuid4().hex, run_id=uuid.uuid4().hex, messages=messages, state={}, tools=[], context=[]
    ).model_dump(mode="json", by_alias=True, exclude_none=True)
    if resume is not None:
        body["resume"] = resume
    return body


async def run(world: World, agent: str, body: dict[str, Any], token: str = ADA) -> tuple[httpx.Response, list[Any]]:
    """POST `body`; the response and its events, each validated by the SDK's `Event` union."""
    headers = {"Accept": "text/event-stream"} | ({"Authorization": f"Bearer {token}"} if token else {})
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(f"{world.url}/atmosphere/ag-ui/{agent}", json=body, headers=headers)
    events = [
        EVENTS.validate_json(line.removeprefix("data: "))
        for line in response.text.splitlines()
        if line.startswith("data: ")
    ]
    return response, events


def types_of(events: list[Any]) -> list[str]:
    return [event.type.value for event in events]


async def test_a_run_streams_as_ag_ui_events(world: World) -> None:
    body = run_input("hello brave new world")
    response, events = await run(world, "echo", body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    types = types_of(events)
    contents = types.count("TEXT_MESSAGE_CONTENT")
    # Streamed in pieces (how many: as governance's output check releases them, pieces released
    # together joined by dispatch), between one start and one end.
    assert contents >= 2
    assert types == [
        "RUN_STARTED",
        "TEXT_MESSAGE_START",
        *["TEXT_MESSAGE_CONTENT"] * contents,
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    assert (events[0].thread_id, events[0].run_id) == (body["threadId"], body["runId"])
    assert "".join(e.delta for e in events if e.type == EventType.TEXT_MESSAGE_CONTENT) == "hello brave new world"
    assert len({e.message_id for e in events[1:-1]}) == 1
    assert events[-1].run_id == body["runId"]
    last = await last_event(world.bus, response.headers["x-atmosphere-run-id"])
    assert last is not None
    assert last.owner == "ada"


async def test_an_approval_is_an_interrupt_and_a_resume_answers_it(world: World) -> None:
    world.provider.script(
        Turn.tool_calls(ToolCallScript("delete_note", {"title": "groceries"})), Turn.text("Deleted it.")
    )
    thread = uuid.uuid4().hex
    _, asked = await run(world, "notes", run_input("delete my groceries note", thread=thread))
    # The call is shown as it is made; its result waits for the answer.
    assert types_of(asked) == [
        "RUN_STARTED",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "CUSTOM",
        "RUN_FINISHED",
    ]
    start = asked[1]
    assert start.tool_call_name == "delete_note"
    assert json.loads(asked[2].delta) == {"title": "groceries"}
    custom, finished = asked[-2], asked[-1]
    assert custom.name == "approval-required"
    assert custom.value["toolName"] == "delete_note"
    assert custom.value["arguments"] == {"title": "groceries"}
    [interrupt] = finished.outcome.interrupts
    assert finished.outcome.type == "interrupt"
    assert interrupt.reason == "tool_approval"
    assert interrupt.tool_call_id == start.tool_call_id
    assert interrupt.response_schema["required"] == ["approve"]
    assert world.ran() == []  # the run waits for the answer

    resume = [{"interruptId": interrupt.id, "status": "resolved", "payload": {"approve": True}}]
    _, rest = await run(world, "notes", run_input(None, thread=thread, resume=resume))
    assert types_of(rest)[:3] == ["RUN_STARTED", "TOOL_CALL_RESULT", "TEXT_MESSAGE_START"]
    assert types_of(rest)[-2:] == ["TEXT_MESSAGE_END", "RUN_FINISHED"]
    assert rest[1].content == "deleted note 'groceries'"
    assert rest[1].tool_call_id == start.tool_call_id
    assert "".join(e.delta for e in rest if e.type == EventType.TEXT_MESSAGE_CONTENT) == "Deleted it."
    assert world.ran() == ["delete_note groceries"]


async def test_an_approval_answered_with_edited_arguments_runs_them(world: World) -> None:
    world.provider.script(Turn.tool_calls(ToolCallScript("delete_note", {"title": "groceries"})), Turn.text("Done."))
    thread = uuid.uuid4().hex
    _, asked = await run(world, "notes", run_input("delete a note", thread=thread))
    [interrupt] = asked[-1].outcome.interrupts
    edited = {"approve": True, "arguments": {"title": "old-todo"}}
    resume = [{"interruptId": interrupt.id, "status": "resolved", "payload": edited}]
    await run(world, "notes", run_input(None, thread=thread, resume=resume))
    assert world.ran() == ["delete_note old-todo"]


@pytest.mark.parametrize(
    "answer",
    [
        {"status": "cancelled"},
        {"status": "resolved", "payload": {"approve": False}},
        {"status": "resolved", "payload": "yes please"},
    ],
    ids=["cancelled", "refused", "unusable"],
)
async def test_anything_but_an_approval_denies(world: World, answer: dict[str, Any]) -> None:
    world.provider.script(
        Turn.tool_calls(ToolCallScript("delete_note", {"title": "groceries"})), Turn.text("I did not delete it.")
    )
    thread = uuid.uuid4().hex
    _, asked = await run(world, "notes", run_input("delete my groceries note", thread=thread))
    [interrupt] = asked[-1].outcome.interrupts
    _, rest = await run(
        world, "notes", run_input(None, thread=thread, resume=[{"interruptId": interrupt.id, **answer}])
    )
    assert types_of(rest)[-1] == "RUN_FINISHED"
    assert world.ran() == []


async def test_another_user_cannot_answer_or_follow_an_interrupted_run(world: World) -> None:
    world.provider.script(Turn.tool_calls(ToolCallScript("delete_note", {"title": "groceries"})), Turn.text("Done."))
    thread = uuid.uuid4().hex
    response, asked = await run(world, "notes", run_input("delete my groceries note", thread=thread))
    [interrupt] = asked[-1].outcome.interrupts
    resume = [{"interruptId": interrupt.id, "status": "resolved", "payload": {"approve": True}}]
    stranger, _ = await run(world, "notes", run_input(None, thread=thread, resume=resume), token=BOB)
    assert stranger.status_code == 404
    assert stranger.json()["code"] == "ingress.unknown_run"
    assert world.ran() == []  # Bob's answer never reached the run
    async with httpx.AsyncClient(base_url=world.url, timeout=10) as http:
        events = f"/atmosphere/runs/{response.headers['x-atmosphere-run-id']}/events"
        assert (await http.get(events, headers={"Authorization": f"Bearer {BOB}"})).status_code == 404
    await run(world, "notes", run_input(None, thread=thread, resume=resume))  # Ada's answer does
    assert world.ran() == ["delete_note groceries"]


async def test_a_plan_is_the_state_snapshot_then_deltas(world: World) -> None:
    first = [{"content": "Outline", "status": "in_progress"}, {"content": "Write", "status": "pending"}]
    second = [{"content": "Outline", "status": "completed"}, {"content": "Write", "status": "in_progress"}]
    world.provider.script(
        Turn.tool_calls(ToolCallScript("write_todos", {"todos": first, "goal": "An essay"})),
        Turn.tool_calls(ToolCallScript("write_todos", {"todos": second, "goal": "An essay"})),
        Turn.text("Planned."),
    )
    _, events = await run(world, "planner", run_input("plan an essay"))
    snapshots = [e for e in events if e.type == EventType.STATE_SNAPSHOT]
    deltas = [e for e in events if e.type == EventType.STATE_DELTA]
    assert len(snapshots) == 1
    assert snapshots[0].snapshot["plan"]["goal"] == "An essay"
    assert [s["status"] for s in snapshots[0].snapshot["plan"]["steps"]] == ["in_progress", "pending"]
    [delta] = deltas
    [op] = delta.delta
    assert (op.op, op.path) == ("replace", "/plan")
    assert [s["status"] for s in op.value["steps"]] == ["completed", "in_progress"]


async def test_a_denied_tool_never_runs(world: World) -> None:
    world.provider.script(
        Turn.tool_calls(ToolCallScript("drop_table", {"table": "users"})), Turn.text("I may not drop it.")
    )
    _, events = await run(world, "notes", run_input("drop the users table"))
    assert "TOOL_CALL_START" not in types_of(events)
    assert "".join(e.delta for e in events if e.type == EventType.TEXT_MESSAGE_CONTENT) == "I may not drop it."
    assert world.ran() == []


async def test_an_email_never_reaches_the_ag_ui_client(world: World) -> None:
    leaky = "Here is the account summary you asked for. " * 6 + f"Contact {EMAIL} for refunds. " + "Thanks. " * 30
    world.provider.script(Turn.text(leaky, words=False))
    response, events = await run(world, "notes", run_input("summarise"))
    assert EMAIL not in response.text
    assert events[-1].type == EventType.RUN_ERROR
    assert events[-1].message == "Response blocked: response contains PII of kinds: [email]"
    assert events[-1].code == "governance.response_blocked"


@pytest.mark.parametrize(
    ("token", "agent", "status", "code"),
    [
        ("", "echo", 401, "ingress.unauthorized"),
        ("nope", "echo", 401, "ingress.unauthorized"),
        (ADA_ECHO, "notes", 403, "ingress.forbidden"),
        (ADA, "nobody", 404, "ingress.unknown_agent"),
    ],
)
async def test_refusals_come_before_the_stream(world: World, token: str, agent: str, status: int, code: str) -> None:
    response, events = await run(world, agent, run_input("hi"), token=token)
    assert response.status_code == status
    assert response.json()["code"] == code
    assert events == []


@pytest.mark.parametrize(
    "body",
    [
        {"threadId": "t", "runId": "r"},
        {"threadId": "t", "runId": "r", "messages": []},
        {"threadId": "t", "runId": "r", "messages": [{"id": "1", "role": "user", "content": "   "}]},
        {"threadId": "t", "runId": "r", "messages": [], "resume": [{"interruptId": "x", "status": "resolved"}]},
    ],
    ids=["no-messages", "no-user-message", "blank", "unknown-interrupt"],
)
async def test_malformed_input_is_a_400(world: World, body: dict[str, Any]) -> None:
    response, _ = await run(world, "echo", body)
    assert response.status_code == 400
    assert response.json()["code"] == "ingress.bad_request"


async def test_the_largest_message_is_served_and_one_byte_more_is_a_413(world: World) -> None:
    served, events = await run(world, "echo", run_input("é" * (MESSAGE_LIMIT // 2)))
    assert served.status_code == 200
    assert "".join(e.delta for e in events if e.type == EventType.TEXT_MESSAGE_CONTENT) == "é" * (MESSAGE_LIMIT // 2)
    over, _ = await run(world, "echo", run_input("é" * (MESSAGE_LIMIT // 2) + "x"))
    assert over.status_code == 413
    assert over.json() == {"error": f"The message exceeds {MESSAGE_LIMIT} bytes", "code": "ingress.too_large"}


async def test_a_client_that_leaves_cancels_its_run(world: World) -> None:
    world.provider.script(Turn.text("thinking " * 60, chunk_delay=0.15))
    headers = {"Authorization": f"Bearer {ADA}"}
    async with httpx.AsyncClient(timeout=30) as http:
        request = http.stream("POST", f"{world.url}/atmosphere/ag-ui/notes", json=run_input("think"), headers=headers)
        async with request as response:
            run_id = response.headers["x-atmosphere-run-id"]
            async for line in response.aiter_lines():
                if "TEXT_MESSAGE_CONTENT" in line:
                    break  # and leave

    async def cancelled() -> bool:
        last = await last_event(world.bus, run_id)
        return last is not None and last.error.code == "run.cancelled"

    await wait_until(cancelled, timeout=15, what="the run to be cancelled")


async def test_the_info_says_the_door_is_served(world: World) -> None:
    async with httpx.AsyncClient(base_url=world.url, timeout=10) as http:
        info = (await http.get("/api/console/info", headers={"Authorization": f"Bearer {ADA}"})).json()
    assert info["agUi"] == {"path": "/atmosphere/ag-ui/{agent}", "protocolVersion": "1.0", "interrupts": True}


# -- the official TypeScript client (@ag-ui/client's HttpAgent, tests/e2e/agui_client) ------------

CLIENT = Path(__file__).parent / "agui_client" / "run.mjs"


async def official_client(world: World, agent: str, **spec: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One run of `@ag-ui/client`'s HttpAgent: the events it delivered, and its final line (state, messages, error)."""
    assert shutil.which("node"), "Node.js is needed for the AG-UI client: make install installs it"
    assert (CLIENT.parent / "node_modules").is_dir(), "the AG-UI client is not installed: run make install"
    request = {"url": f"{world.url}/atmosphere/ag-ui/{agent}", "token": ADA, **spec}
    process = await asyncio.create_subprocess_exec("node", str(CLIENT), stdin=PIPE, stdout=PIPE, stderr=PIPE)
    out, err = await asyncio.wait_for(process.communicate(json.dumps(request).encode()), 60)
    assert process.returncode == 0, err.decode()
    lines = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
    return [line["event"] for line in lines if "event" in line], lines[-1]


async def test_the_official_client_runs_a_tool_call_through_an_approval(world: World) -> None:
    world.provider.script(
        Turn.tool_calls(ToolCallScript("delete_note", {"title": "groceries"})), Turn.text("Deleted it.")
    )
    thread = uuid.uuid4().hex
    asked = {
        "threadId": thread,
        "runId": uuid.uuid4().hex,
        "messages": [{"id": "m1", "role": "user", "content": "delete my groceries note"}],
    }
    events, first = await official_client(world, "notes", **asked)
    assert first["error"] is None, first
    assert first["warnings"] == []
    [pending] = first["pendingInterrupts"]
    assert pending["reason"] == "tool_approval"
    assert [e["type"] for e in events][-2:] == ["CUSTOM", "RUN_FINISHED"]
    [call] = next(m for m in first["messages"] if m.get("toolCalls"))["toolCalls"]
    assert call["function"]["name"] == "delete_note"
    assert world.ran() == []

    answer = {
        "threadId": thread,
        "runId": uuid.uuid4().hex,
        "messages": first["messages"],
        "pendingInterrupts": first["pendingInterrupts"],
        "resume": [{"interruptId": pending["id"], "status": "resolved", "payload": {"approve": True}}],
    }
    events, done = await official_client(world, "notes", **answer)
    assert done["error"] is None, done
    assert done["warnings"] == []
    assert done["pendingInterrupts"] in ([], None)
    [tool_message] = [m for m in done["messages"] if m["role"] == "tool"]
    assert tool_message["content"] == "deleted note 'groceries'"
    assert tool_message["toolCallId"] == call["id"]
    assert done["messages"][-1]["role"] == "assistant"
    assert done["messages"][-1]["content"] == "Deleted it."
    assert world.ran() == ["delete_note groceries"]


async def test_the_official_client_keeps_the_plan_as_its_state(world: World) -> None:
    first = [{"content": "Outline", "status": "in_progress"}, {"content": "Write", "status": "pending"}]
    second = [{"content": "Outline", "status": "completed"}, {"content": "Write", "status": "in_progress"}]
    world.provider.script(
        Turn.tool_calls(ToolCallScript("write_todos", {"todos": first, "goal": "An essay"})),
        Turn.tool_calls(ToolCallScript("write_todos", {"todos": second, "goal": "An essay"})),
        Turn.text("Planned."),
    )
    request = {
        "threadId": uuid.uuid4().hex,
        "runId": uuid.uuid4().hex,
        "messages": [{"id": "m1", "role": "user", "content": "plan an essay"}],
    }
    _, done = await official_client(world, "planner", **request)
    assert done["error"] is None, done
    assert done["warnings"] == []
    assert done["state"]["plan"]["goal"] == "An essay"
    assert [step["status"] for step in done["state"]["plan"]["steps"]] == ["completed", "in_progress"]
    assert done["messages"][-1]["content"] == "Planned."


async def test_the_official_client_reports_a_refusal(world: World) -> None:
    request = {
        "threadId": "t",
        "runId": "r",
        "messages": [{"id": "m1", "role": "user", "content": "hi"}],
        "token": "nope",
    }
    _, done = await official_client(world, "echo", **request)
    assert done["httpStatus"] == 401
    assert "ingress.unauthorized" in done["error"]
