"""What each event is to the tape: its kind, its payload, whether it is coalesced, skipped, a boundary."""

from typing import Any

from atmosphere.bus.errors import RunCancelledError
from atmosphere.contracts.common.v1.common_pb2 import Error
from atmosphere.contracts.run.v1.run_pb2 import (
    Complete,
    Content,
    Metadata,
    Progress,
    ReasoningDelta,
    RunEvent,
    TextComplete,
    TextDelta,
    ToolStart,
)
from atmosphere.tape.steps import (
    OWN_LANE,
    REASONING,
    FullText,
    Lane,
    Piece,
    Record,
    Skip,
    classify,
    step_kind,
    step_payload,
    step_record,
)


def event(seq: int = 1, **fields: Any) -> RunEvent:
    return RunEvent(run_id="r1", seq=seq, **fields)


def test_step_kinds_use_wire_names() -> None:
    assert step_kind(event(text_delta=TextDelta(text="x"))) == "text"
    assert step_kind(event(tool_start=ToolStart(tool_name="t"))) == "tool-start"
    assert step_kind(event(text_complete=TextComplete())) == "text-complete"
    assert step_kind(event(complete=Complete())) == "complete"
    assert step_kind(event()) == "unknown"


def test_payloads_are_json_and_never_binary() -> None:
    assert step_payload(event(metadata=Metadata(key="k", value_json='{"a": 1}'))) == {"key": "k", "value": {"a": 1}}
    content = step_payload(event(content=Content(content_type="image", mime_type="image/png", data=b"\x89PNG")))
    assert content["byteLength"] == 4
    assert len(str(content["sha256"])) == 64
    assert "data" not in content
    assert step_payload(event(tool_start=ToolStart(tool_name="t", arguments_json="{}"))) == {
        "toolName": "t",
        "callId": "",
        "argumentsJson": "{}",
    }


def test_text_is_coalesced_by_lane_and_text_complete_is_the_full_text() -> None:
    assert classify(event(text_delta=TextDelta(text="a"))) == Piece(OWN_LANE, "a")
    forwarded = classify(event(text_delta=TextDelta(text="b"), origin_run_id="sub", origin_agent="helper"))
    assert forwarded == Piece(Lane("subagent-text", "sub", "helper"), "b")
    reasoning = classify(event(reasoning_delta=ReasoningDelta(text="", redacted=True)))
    assert reasoning == Piece(Lane(REASONING, redacted=True), "")
    assert classify(event(text_complete=TextComplete(full_text="all"))) == FullText("all")


def test_terminals_boundaries_and_skips() -> None:
    complete = Record(
        "complete", {"summary": "", "finishReason": "", "clientToolCalls": []}, terminal_status="COMPLETED"
    )
    assert classify(event(complete=Complete())) == complete
    cancelled = classify(event(error=Error(code=RunCancelledError.code, message="bye")))
    assert isinstance(cancelled, Record)
    assert cancelled.terminal_status == "CANCELLED"
    failed = classify(event(error=Error(code="provider.timeout")))
    assert isinstance(failed, Record)
    assert failed.terminal_status == "ERROR"
    tool = classify(event(tool_start=ToolStart(tool_name="t")))
    assert isinstance(tool, Record)
    assert tool.boundary
    progress = classify(event(progress=Progress(message="p")))
    assert isinstance(progress, Record)
    assert not progress.boundary
    assert classify(event(metadata=Metadata(key="ai.toolCall.delta.c1", value_json='"{"'))) == Skip()


def test_a_forwarded_terminal_ends_nothing() -> None:
    forwarded = classify(event(complete=Complete(), origin_run_id="sub", origin_agent="helper"))
    assert isinstance(forwarded, Record)
    assert forwarded.terminal_status is None
    assert forwarded.payload["originRunId"] == "sub"


def test_step_record_is_one_event_alone() -> None:
    record = step_record(event(seq=7, text_delta=TextDelta(text="x")))
    assert (record.step.seq, record.step.kind, record.step.payload) == (7, "text", '{"text": "x"}')
