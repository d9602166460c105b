import json

import pytest

from atmosphere.bus.frames import to_frame
from atmosphere.bus.runs import SERVER_SIDE_KINDS
from atmosphere.contracts.common.v1.common_pb2 import Error, Usage
from atmosphere.contracts.run.v1 import run_pb2
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.ingress.errors import MalformedRequestError as InboundError
from atmosphere.ingress.inbound import parse_inbound


def frame(**kind: object) -> dict[str, object]:
    result = to_frame(RunEvent(run_id="r", seq=7, session_id="s", **kind))
    assert result is not None
    assert (result.pop("sessionId"), result.pop("seq")) == ("s", 7)
    json.dumps(result)  # every frame is plain JSON
    return result


def test_legacy_type_frames() -> None:
    assert frame(text_delta=run_pb2.TextDelta(text="Hi")) == {"type": "streaming-text", "data": "Hi"}
    assert frame(progress=run_pb2.Progress(message="Thinking...")) == {"type": "progress", "data": "Thinking..."}
    assert frame(metadata=run_pb2.Metadata(key="X-Atmosphere-Run-Id", value_json='"r"')) == {
        "type": "metadata",
        "key": "X-Atmosphere-Run-Id",
        "value": "r",
    }
    assert frame(complete=run_pb2.Complete()) == {"type": "complete"}
    assert frame(complete=run_pb2.Complete(summary="done")) == {"type": "complete", "data": "done"}
    assert frame(complete=run_pb2.Complete(finish_reason="stop")) == {"type": "complete", "finishReason": "stop"}
    assert frame(complete=run_pb2.Complete(finish_reason="length")) == {"type": "complete", "finishReason": "length"}
    provider_refusal = Error(
        code="provider.rejected",
        message="API returned 400: too long",
        details={"status": "400", "provider_code": "context_length_exceeded"},
    )
    assert frame(error=provider_refusal) == {
        "type": "error",
        "data": "API returned 400: too long",
        "code": "provider.rejected",
        "recoverable": False,
        "details": {"status": "400", "provider_code": "context_length_exceeded"},
    }
    assert frame(error=Error(code="agent.failed", message="boom", retryable=True)) == {
        "type": "error",
        "data": "boom",
        "code": "agent.failed",
        "recoverable": True,
    }
    assert frame(
        content=run_pb2.Content(content_type="file", mime_type="text/plain", data=b"hi", file_name="a.txt")
    ) == {
        "type": "content",
        "contentType": "file",
        "mimeType": "text/plain",
        "data": "aGk=",
        "fileName": "a.txt",
    }
    assert frame(tool_call_delta=run_pb2.ToolCallDelta(call_id="c1", arguments_fragment='{"ci')) == {
        "type": "metadata",
        "key": "ai.toolCall.delta.c1",
        "value": '{"ci',
    }


def test_typed_event_frames() -> None:
    assert frame(tool_start=run_pb2.ToolStart(tool_name="weather", arguments_json='{"city": "Paris"}')) == {
        "event": "tool-start",
        "data": {"toolName": "weather", "arguments": {"city": "Paris"}},
    }
    assert frame(tool_result=run_pb2.ToolResult(tool_name="weather", result="sunny")) == {
        "event": "tool-result",
        "data": {"toolName": "weather", "result": "sunny"},
    }
    assert frame(
        plan_update=run_pb2.PlanUpdate(
            steps=[run_pb2.PlanStep(content="a", status="pending")], conversation_id="c", agent_id="x"
        )
    ) == {
        "event": "plan-update",
        "data": {"steps": [{"content": "a", "status": "pending"}], "goal": None, "conversationId": "c", "agentId": "x"},
    }
    assert frame(
        approval_required=run_pb2.ApprovalRequired(
            approval_id="apr_0123456789ab", tool_name="rm", arguments_json="{}", message="ok?", expires_in_seconds=300
        )
    ) == {
        "event": "approval-required",
        "data": {
            "approvalId": "apr_0123456789ab",
            "toolName": "rm",
            "arguments": {},
            "message": "ok?",
            "expiresIn": 300,
        },
    }
    with_call = frame(approval_required=run_pb2.ApprovalRequired(approval_id="apr_0123456789ab", call_id="call_7"))
    assert with_call["data"]["callId"] == "call_7"  # which tool call it is for, when known
    assert frame(usage=Usage(input_tokens=3, output_tokens=4, total_tokens=7, model="m")) == {
        "event": "usage",
        "data": {"input": 3, "output": 4, "cachedInput": 0, "total": 7, "model": "m"},
    }
    assert frame(progress=run_pb2.Progress(message="half", percentage=0.5)) == {
        "event": "progress",
        "data": {"message": "half", "percentage": 0.5},
    }


def test_plan_steps_carry_active_form_and_goal() -> None:
    update = run_pb2.PlanUpdate(
        steps=[
            run_pb2.PlanStep(content="Write it", status="in_progress", active_form="Writing it"),
            run_pb2.PlanStep(content="Ship it", status="pending"),
        ],
        goal="",
        conversation_id="c",
        agent_id="x",
    )
    assert frame(plan_update=update)["data"] == {
        "steps": [
            {"content": "Write it", "status": "in_progress", "activeForm": "Writing it"},
            {"content": "Ship it", "status": "pending"},
        ],
        "goal": "",
        "conversationId": "c",
        "agentId": "x",
    }


def test_a_sub_run_event_is_tagged_and_its_text_is_typed() -> None:
    forwarded = run_pb2.RunEvent(
        run_id="parent",
        seq=9,
        session_id="s",
        origin_run_id="child",
        origin_agent="research",
        text_delta=run_pb2.TextDelta(text="found it"),
    )
    assert to_frame(forwarded) == {
        "event": "text-delta",
        "data": {"text": "found it"},
        "runId": "child",
        "parentRunId": "parent",
        "agent": "research",
        "sessionId": "s",
        "seq": 9,
    }
    tool = run_pb2.RunEvent(
        run_id="parent",
        seq=10,
        session_id="s",
        origin_run_id="child",
        origin_agent="research",
        tool_start=run_pb2.ToolStart(tool_name="ls", arguments_json="{}"),
    )
    assert to_frame(tool) == {
        "event": "tool-start",
        "data": {"toolName": "ls", "arguments": {}},
        "runId": "child",
        "parentRunId": "parent",
        "agent": "research",
        "sessionId": "s",
        "seq": 10,
    }


def test_every_event_kind_has_a_frame_but_those_kept_server_side() -> None:
    kinds = [f.name for f in RunEvent.DESCRIPTOR.oneofs_by_name["kind"].fields]
    assert set(kinds) > SERVER_SIDE_KINDS
    for kind in kinds:
        field = RunEvent.DESCRIPTOR.fields_by_name[kind]
        event = RunEvent(seq=1, session_id="s")
        getattr(event, kind).SetInParent()
        result = to_frame(event)
        if kind in SERVER_SIDE_KINDS:  # the model's input (system prompt included) never reaches a client
            assert result is None, kind
            continue
        assert result is not None, kind
        assert ("type" in result) != ("event" in result), kind
        assert field.message_type is not None
    assert to_frame(RunEvent()) is None


@pytest.mark.parametrize(
    ("raw", "text", "metadata"),
    [
        ("hello", "hello", {}),
        ('{"prompt": "hi", "hints": {"maxCost": 0.5}}', "hi", {"hints.maxCost": "0.5"}),
        ("{not json at all", "{not json at all", {}),
        ("[1, 2]", "[1, 2]", {}),
    ],
)
def test_inbound_prompts(raw: str, text: str, metadata: dict[str, str]) -> None:
    prompt = parse_inbound(raw)
    assert (prompt.text, prompt.metadata) == (text, metadata)


@pytest.mark.parametrize("raw", ["", "   ", '{"prompt": ""}', '{"prompt": 3}', '{"prompt": "x", "hints": []}'])
def test_unusable_inbound_frames_are_refused(raw: str) -> None:
    with pytest.raises(InboundError):
        parse_inbound(raw)
