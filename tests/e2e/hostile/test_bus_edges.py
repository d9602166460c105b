"""Hostile messages sent straight onto each service's subjects: a clear answer, never a crash.

Each case puts bytes on a subject with a plain bus request (or a publish, for subjects nobody
answers): undecodable payloads, messages of the wrong type, oversized fields, malformed ids,
paths and page tokens, numbers out of range, unknown tools. A request/reply subject must answer
with a typed `Error` (or, for a tool subject, an `Error: ...` tool result); a publish-only
subject must ignore it. After every case each of the six services still answers its health
check and a normal request, and a normal run completes end to end.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from google.protobuf.message import Message

from atmosphere.bus import NatsBus, subjects
from atmosphere.bus._codec import TYPE_HEADER
from atmosphere.bus.runs import follow_run
from atmosphere.contracts.common.v1.common_pb2 import Error, Principal
from atmosphere.contracts.common.v1.service_pb2 import HealthCheckRequest, HealthCheckResponse
from atmosphere.contracts.governance.v1.governance_pb2 import (
    AdmitRequest,
    CheckToolCallRequest,
    ListDecisionsRequest,
    ListDecisionsResponse,
    ScreenFactsRequest,
)
from atmosphere.contracts.memory.v1.memory_pb2 import (
    AppendTurnRequest,
    ChatMessage,
    DropWorkspaceRequest,
    GetPlanRequest,
    ListFilesRequest,
    LoadHistoryRequest,
    LoadHistoryResponse,
    ReadFileRequest,
    ReplaceHistoryRequest,
    SaveFactsRequest,
)
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, RunSubmission
from atmosphere.contracts.tape.v1.tape_pb2 import GetStepsRequest, GetStepsResponse, ListRunsRequest
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolReply, WorkspaceScope

from .conftest import HostileStack

SERVICES = ("governance", "memory", "tape", "sandbox", "dispatch", "ingress")
SCOPE = WorkspaceScope(category="agents", owner="notes", agent_id="notes", conversation_id="c1")
LONG = "n" * 5000
NESTED = "[" * 20_000 + "]" * 20_000
DIGITS = "9" * 5000
GARBAGE = b"\xff\xfe\xfd\x00garbage"
ERROR_TYPE = Error.DESCRIPTOR.full_name


@dataclass(frozen=True)
class Case:
    """One hostile message and the answer it must get."""

    subject: str
    payload: bytes
    expect: str
    """An `Error` code, "tool-error" (an `Error: ...` tool result) or "ignored" (publish-only)."""


def request(subject: str, message: Message | bytes, expect: str) -> Case:
    payload = message if isinstance(message, bytes) else message.SerializeToString()
    return Case(subject, payload, expect)


def tool_call(name: str, arguments: str, *, memory: bool = False) -> Case:
    call = ToolCall(call_id="h", name=name, arguments_json=arguments, run_id="r", agent="notes")
    if memory:
        call.workspace.CopyFrom(SCOPE)
    subject = subjects.memory_tool(name) if memory else subjects.tool(name)
    return request(subject, call, "tool-error")


def scope(**fields: str) -> WorkspaceScope:
    values = {"category": "agents", "owner": "notes", "agent_id": "notes", "conversation_id": "c1", **fields}
    return WorkspaceScope(**values)


def history(**fields: Any) -> LoadHistoryRequest:
    return LoadHistoryRequest(agent="notes", conversation_id="c1", **fields)


CASES: dict[str, Case] = {
    # -- memory: history, facts, workspaces ------------------------------------------------------
    "memory-load-undecodable": request(subjects.memory("history.load"), GARBAGE, "bus.decode"),
    "memory-load-garbage-token": request(
        subjects.memory("history.load"), history(page_token="garbage"), "memory.bad_request"
    ),
    "memory-load-negative-token": request(
        subjects.memory("history.load"), history(page_token="-1:0:0-0-0"), "memory.bad_request"
    ),
    "memory-load-huge-token": request(
        subjects.memory("history.load"), history(page_token=f"{DIGITS}:0:0-0-0"), "memory.bad_request"
    ),
    "memory-load-stale-token": request(
        subjects.memory("history.load"), history(page_token="5:0:9-1-9"), "memory.history_changed"
    ),
    "memory-append-blank-conversation": request(
        subjects.memory("history.append"),
        AppendTurnRequest(agent="notes", conversation_id="  ", user=ChatMessage(role="user", content="hi")),
        "memory.bad_request",
    ),
    "memory-replace-unknown-role": request(
        subjects.memory("history.replace"),
        ReplaceHistoryRequest(agent="notes", conversation_id="c1", messages=[ChatMessage(role="wizard", content="x")]),
        "memory.bad_request",
    ),
    "memory-replace-negative-base": request(
        subjects.memory("history.replace"),
        ReplaceHistoryRequest(agent="notes", conversation_id="c1", base_count=-5, base_sha256="00"),
        "memory.bad_request",
    ),
    "memory-replace-wrong-type": request(
        # A ToolCall's arguments land where ReplaceHistoryRequest has its messages: not a message.
        subjects.memory("history.replace"),
        ToolCall(arguments_json="{}"),
        "bus.decode",
    ),
    "memory-facts-blank-user": request(
        subjects.memory("facts.save"), SaveFactsRequest(user_id=" ", facts=["x"]), "memory.bad_request"
    ),
    "memory-read-traversal": request(
        subjects.memory("files.read"), ReadFileRequest(workspace=SCOPE, path="../../etc/passwd"), "memory.bad_request"
    ),
    "memory-read-negative-offset": request(
        subjects.memory("files.read"), ReadFileRequest(workspace=SCOPE, path="a.txt", offset=-1), "memory.bad_request"
    ),
    "memory-list-negative-offset": request(
        subjects.memory("files.list"), ListFilesRequest(workspace=SCOPE, offset=-7), "memory.bad_request"
    ),
    "memory-list-hostile-category": request(
        subjects.memory("files.list"), ListFilesRequest(workspace=scope(category="../../etc")), "memory.bad_request"
    ),
    "memory-plan-traversal": request(
        subjects.memory("plan.get"), GetPlanRequest(workspace=scope(agent_id="../../x")), "memory.bad_request"
    ),
    "memory-drop-whole-non-ephemeral": request(
        subjects.memory("workspace.drop"), DropWorkspaceRequest(workspace=SCOPE), "memory.bad_request"
    ),
    "memory-tool-not-json": tool_call("read_file", "{not json", memory=True),
    "memory-tool-nested": tool_call("write_file", NESTED, memory=True),
    "memory-tool-huge-offset": tool_call("read_file", json.dumps({"path": "a.txt", "offset": DIGITS}), memory=True),
    "memory-tool-traversal": tool_call("write_file", json.dumps({"path": "../x", "content": "y"}), memory=True),
    "memory-tool-unknown": tool_call("format_disk", "{}", memory=True),
    "memory-tool-long-path": tool_call("read_file", json.dumps({"path": "p/" * 3000 + "x"}), memory=True),
    # -- governance ------------------------------------------------------------------------------
    "governance-admit-undecodable": request(subjects.governance("admit"), GARBAGE, "bus.decode"),
    "governance-admit-long-principal": request(
        subjects.governance("admit"),
        AdmitRequest(agent="echo", principal=Principal(name=LONG)),
        "governance.bad_request",
    ),
    "governance-check-long-tool": request(
        subjects.governance("check_tool"), CheckToolCallRequest(run_id="r", tool_name=LONG), "governance.bad_request"
    ),
    "governance-decisions-long-run": request(
        subjects.governance("decisions"), ListDecisionsRequest(run_id=LONG), "governance.bad_request"
    ),
    "governance-screen-long-user": request(
        subjects.governance("screen_facts"), ScreenFactsRequest(facts=["x"], user_id=LONG), "governance.bad_request"
    ),
    "governance-screen-too-many": request(
        subjects.governance("screen_facts"), ScreenFactsRequest(facts=["x"] * 60_000), "governance.bad_request"
    ),
    # -- tape ------------------------------------------------------------------------------------
    "tape-steps-undecodable": request(subjects.tape("steps"), GARBAGE, "bus.decode"),
    "tape-steps-huge-seq": request(
        subjects.tape("steps"), GetStepsRequest(run_id="r", from_seq=2**64 - 1), "tape.bad_request"
    ),
    "tape-steps-long-run": request(subjects.tape("steps"), GetStepsRequest(run_id=LONG), "tape.bad_request"),
    "tape-runs-long-tape": request(subjects.tape("runs"), ListRunsRequest(tape_id=LONG), "tape.bad_request"),
    # -- sandbox ---------------------------------------------------------------------------------
    "sandbox-undecodable": request(subjects.tool("delete_note"), GARBAGE, "bus.decode"),
    "sandbox-not-json": tool_call("delete_note", "{not json"),
    "sandbox-nested": tool_call("delete_note", NESTED),
    "sandbox-huge-number": tool_call("delete_note", '{"title": ' + DIGITS + "}"),
    "sandbox-not-an-object": tool_call("delete_note", '["title"]'),
    "sandbox-wrong-argument-type": tool_call("delete_note", '{"title": {"nested": true}}'),
    "sandbox-missing-argument": tool_call("delete_note", "{}"),
    # -- service health, publish-only subjects ---------------------------------------------------
    "health-undecodable": request(subjects.service_health("memory"), GARBAGE, "bus.decode"),
    "conversation-closed-garbage": request(subjects.conversation_closed(), GARBAGE, "ignored"),
    "run-events-garbage": request(subjects.run_events("not-a-run"), GARBAGE, "ignored"),
}


async def send(bus: NatsBus, case: Case) -> tuple[str, str]:
    """Send `case` raw; what came back: ("error", code), ("tool-error", text) or ("ignored", "")."""
    if case.expect == "ignored":
        await bus.client.publish(bus.wire_subject(case.subject), case.payload)
        await bus.client.flush()
        return "ignored", ""
    reply = await bus.client.request(bus.wire_subject(case.subject), case.payload, timeout=10)
    if (reply.headers or {}).get(TYPE_HEADER) == ERROR_TYPE:
        return "error", Error.FromString(reply.data).code
    result = ToolReply.FromString(reply.data)
    return ("tool-error" if result.is_error else "tool-result"), result.content


async def still_answering(bus: NatsBus) -> None:
    """Every service answers health over its own connection; memory, tape and dispatch do their work."""
    for service in SERVICES:
        health = await bus.request(subjects.service_health(service), HealthCheckRequest(), HealthCheckResponse)
        assert health.ready, service
    await bus.request(subjects.memory("history.load"), history(), LoadHistoryResponse)
    await bus.request(subjects.tape("steps"), GetStepsRequest(run_id="none"), GetStepsResponse)
    await bus.request(subjects.governance("decisions"), ListDecisionsRequest(limit=1), ListDecisionsResponse)
    run = RunSubmission(run_id=uuid.uuid4().hex, session_id="s", conversation_id="c", agent="echo", message="a b")
    events = [event async for event in follow_run(bus, run.run_id, submit=run)]
    assert events[-1].WhichOneof("kind") == "complete", events[-1]


@pytest.mark.parametrize("name", list(CASES))
def test_a_hostile_message_gets_a_clear_answer(hostile: HostileStack, name: str) -> None:
    case = CASES[name]
    bus = hostile.stack.bus
    assert isinstance(bus, NatsBus)
    kind, detail = hostile.call(send(bus, case))
    if case.expect == "tool-error":
        assert kind == "tool-error", (kind, detail)
        assert detail.startswith(("Error: ", '{"error"')), detail
    elif case.expect == "ignored":
        assert kind == "ignored"
    else:
        assert (kind, detail) == ("error", case.expect)
    hostile.call(still_answering(bus))
    hostile.check_still_serving()


@pytest.mark.parametrize(
    "payload",
    [GARBAGE, RunEvent(run_id="x").SerializeToString()],
    ids=["undecodable", "wrong-type"],
)
def test_a_hostile_submission_is_dropped_and_the_queue_goes_on(hostile: HostileStack, payload: bytes) -> None:
    bus = hostile.stack.bus
    assert isinstance(bus, NatsBus)

    async def submit() -> None:
        js = bus.client.jetstream()
        await js.publish(bus.wire_subject(subjects.run_submit("echo")), payload)

    hostile.call(submit())
    hostile.call(still_answering(bus))
    hostile.check_still_serving()


def test_a_run_for_an_unknown_agent_ends_with_a_clear_error(hostile: HostileStack) -> None:
    bus = hostile.stack.bus

    async def run() -> list[RunEvent]:
        request = RunSubmission(run_id=uuid.uuid4().hex, session_id="s", agent="nobody-home", message="hi")
        return [event async for event in follow_run(bus, request.run_id, submit=request)]

    events = hostile.call(run())
    assert events[-1].error.code == "dispatch.unknown_agent"
    hostile.call(still_answering(bus))
