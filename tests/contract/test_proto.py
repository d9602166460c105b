"""The contracts: every event kind of the wire protocol exists, and old readers tolerate new fields."""

from __future__ import annotations

from atmosphere.bus.runs import SERVER_SIDE_KINDS
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, TextDelta
from atmosphere.contracts.tape.v1.tape_pb2 import GetStepsRequest

# Reference §5: legacy type frames, typed AiEvent frames, and the metadata conventions.
WIRE_KINDS = {
    "text_delta",
    "text_complete",
    "progress",
    "metadata",
    "content",
    "tool_start",
    "tool_result",
    "tool_error",
    "tool_call_delta",
    "plan_update",
    "agent_step",
    "approval_required",
    "usage",
    "confidence",
    "reasoning_delta",
    "reasoning_complete",
    "handoff",
    "structured_field",
    "entity_start",
    "entity_complete",
    "routing_decision",
    "citation",
    "complete",
    "error",
}


def test_run_event_covers_every_wire_kind() -> None:
    kinds = {f.name for f in RunEvent.DESCRIPTOR.oneofs_by_name["kind"].fields}
    # Plus the kinds kept server-side (the model's input, for the tape and the journal).
    assert kinds == WIRE_KINDS | SERVER_SIDE_KINDS
    assert not WIRE_KINDS & SERVER_SIDE_KINDS


def test_round_trip_and_unknown_fields_are_kept() -> None:
    event = RunEvent(run_id="r", seq=3, text_delta=TextDelta(text="hi"))
    assert RunEvent.FromString(event.SerializeToString()) == event
    # A newer writer adds field 999; an older reader keeps it and passes it on intact.
    newer = event.SerializeToString() + b"\xba\x3e\x03abc"
    older = RunEvent.FromString(newer)
    assert older.text_delta.text == "hi"
    assert older.SerializeToString() == newer


def test_messages_are_distinct_types() -> None:
    assert GetStepsRequest.DESCRIPTOR.full_name == "atmosphere.contracts.tape.v1.GetStepsRequest"
