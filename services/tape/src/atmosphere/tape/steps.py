"""What one run event is to the tape: skipped, a piece of coalesced text, the full text, or a step.

Step kinds use the wire's event names (`tool-start`, `plan-update`, ...); payloads are the
event's fields as JSON (protobuf's JSON names), except:

* text deltas are coalesced into `text` steps (`recorder.py`); a sub-agent's text forwarded into
  the run (`origin_run_id` set) is not the run's own answer and goes to `subagent-text` steps
  (with `originRunId`, `originAgent`); reasoning deltas are coalesced too, into
  `reasoning-delta` steps (the original stores one per delta: per token, a few answers would
  spend a run's whole step cap);
* `content` is a descriptor only (`contentType`, `mimeType`, `fileName`, `byteLength`, `sha256`);
* `metadata` is `{key, value}` with the value parsed (kept as text when it is not JSON); keys
  starting `ai.toolCall.delta.`, and `tool_call_delta` events, are not recorded; the
  `ai.run.resumed` marker becomes a `resumed` step;
* `input` is `{messages: [{role, content}], model?, omittedMessages?}`;
* usage and confidence stay typed `usage` / `confidence` steps (one event, one step: the
  original's split into several `ai.tokens.*` metadata steps would need several seqs);
* every other event forwarded from a sub-agent keeps its kind, its payload gaining
  `originRunId` and `originAgent`; it never ends the run, and a replay leaves it out.

Semantic boundaries (`BOUNDARY_KINDS`) close the text being coalesced; the others
(`progress`, `metadata`, `usage`, ...) do not.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.json_format import MessageToDict

from atmosphere.bus.errors import RunCancelledError
from atmosphere.bus.runs import RESUMED_METADATA_KEY
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.tape.store import Step

TOOL_CALL_DELTA_PREFIX = "ai.toolCall.delta."
"""Metadata keys of streamed tool-argument fragments: not recorded."""

BOUNDARY_KINDS = frozenset(
    {
        "tool-start",
        "tool-result",
        "tool-error",
        "agent-step",
        "handoff",
        "entity-start",
        "routing-decision",
        "plan-update",
        "approval-required",
        "reasoning-complete",
        # Not in the original's list, which records them outside the text stream: a new model
        # exchange, and a new attempt of the run, start new text.
        "input",
        "resumed",
    }
)
"""Step kinds that close the text being coalesced (it precedes them)."""

OWN_TEXT = "text"
SUBAGENT_TEXT = "subagent-text"
REASONING = "reasoning-delta"

_KIND_NAMES = {"text_delta": OWN_TEXT, "text_complete": "text-complete"}


@dataclass(frozen=True, slots=True)
class Lane:
    """The stream of text a piece belongs to; pieces of one lane coalesce into one step."""

    kind: str
    """`text` (the run's own answer), `subagent-text` or `reasoning-delta`."""
    origin_run_id: str = ""
    origin_agent: str = ""
    redacted: bool = False
    """Reasoning the model redacted (its text is empty)."""

    def payload(self, text: str, *, truncated: bool) -> dict[str, Any]:
        """The payload of a step of this lane holding `text`."""
        payload: dict[str, Any] = {"text": text}
        if self.kind == REASONING:
            payload["redacted"] = self.redacted
        if self.origin_run_id:
            payload.update(originRunId=self.origin_run_id, originAgent=self.origin_agent)
        if truncated:
            payload["truncated"] = True
        return payload

    @classmethod
    def of(cls, kind: str, payload: dict[str, Any]) -> Lane | None:
        """The lane of a stored step, or None when `kind` is not coalesced text."""
        if kind not in (OWN_TEXT, SUBAGENT_TEXT, REASONING) or not isinstance(payload.get("text"), str):
            return None
        return cls(
            kind,
            str(payload.get("originRunId", "")),
            str(payload.get("originAgent", "")),
            bool(payload.get("redacted", False)),
        )


OWN_LANE = Lane(OWN_TEXT)


@dataclass(frozen=True, slots=True)
class Skip:
    """Not recorded (its seq still counts as seen)."""


@dataclass(frozen=True, slots=True)
class Piece:
    """A piece of text to coalesce into its lane's step."""

    lane: Lane
    text: str


@dataclass(frozen=True, slots=True)
class FullText:
    """The run's own text of the model round so far, whole (`text_complete`)."""

    text: str


@dataclass(frozen=True, slots=True)
class Record:
    """One step of its own."""

    kind: str
    payload: dict[str, Any] = field(default_factory=dict)
    boundary: bool = False
    terminal_status: str | None = None
    """"COMPLETED", "ERROR" or "CANCELLED" when the step ends the run."""
    model: str = ""
    """The model the event names (input, usage), if any."""


Entry = Skip | Piece | FullText | Record


def step_kind(event: RunEvent) -> str:
    """The step kind of `event`, e.g. "text", "tool-start", "complete"."""
    kind = event.WhichOneof("kind") or "unknown"
    return _KIND_NAMES.get(kind, kind.replace("_", "-"))


def _metadata_value(value_json: str) -> Any:
    try:
        return json.loads(value_json or "null")
    except (json.JSONDecodeError, RecursionError):
        return value_json


def step_payload(event: RunEvent) -> dict[str, Any]:
    """The JSON payload of `event` as one step (binary content as a descriptor only)."""
    kind = event.WhichOneof("kind")
    if kind is None:
        return {}
    if kind == "content":
        content = event.content
        return {
            "contentType": content.content_type,
            "mimeType": content.mime_type,
            "fileName": content.file_name,
            "byteLength": len(content.data),
            "sha256": hashlib.sha256(content.data).hexdigest(),
        }
    if kind == "metadata":
        return {"key": event.metadata.key, "value": _metadata_value(event.metadata.value_json)}
    if kind == "input":
        payload: dict[str, Any] = {"messages": [{"role": m.role, "content": m.content} for m in event.input.messages]}
        if event.input.model:
            payload["model"] = event.input.model
        if event.input.omitted_messages:
            payload["omittedMessages"] = event.input.omitted_messages
        return payload
    return MessageToDict(getattr(event, kind), always_print_fields_with_no_presence=True)


def terminal_status(event: RunEvent) -> str | None:
    """The status `event` ends its run with, or None (a sub-agent's forwarded event ends nothing)."""
    kind = event.WhichOneof("kind")
    if event.origin_run_id:
        return None
    if kind == "complete":
        return "COMPLETED"
    if kind == "error":
        return "CANCELLED" if event.error.code == RunCancelledError.code else "ERROR"
    return None


def _model_of(event: RunEvent) -> str:
    kind = event.WhichOneof("kind")
    if kind == "input":
        return event.input.model
    if kind == "usage":
        return event.usage.model
    if kind == "complete":
        return event.complete.usage.model
    return ""


def _pieces(event: RunEvent, kind: str | None) -> Entry | None:
    """The entry of a piece of streamed text, or None when `event` is not one."""
    origin = (event.origin_run_id, event.origin_agent)
    if kind == "text_delta":
        lane = Lane(SUBAGENT_TEXT, *origin) if event.origin_run_id else OWN_LANE
        return Piece(lane, event.text_delta.text)
    if kind == "reasoning_delta":
        return Piece(Lane(REASONING, *origin, event.reasoning_delta.redacted), event.reasoning_delta.text)
    if kind == "text_complete" and not event.origin_run_id:
        return FullText(event.text_complete.full_text)
    return None


def classify(event: RunEvent) -> Entry:
    """What the tape does with `event`."""
    kind = event.WhichOneof("kind")
    if kind == "tool_call_delta":
        return Skip()
    piece = _pieces(event, kind)
    if piece is not None:
        return piece
    if kind == "metadata":
        if event.metadata.key.startswith(TOOL_CALL_DELTA_PREFIX):
            return Skip()
        if event.metadata.key == RESUMED_METADATA_KEY and not event.origin_run_id:
            return Record("resumed", {"value": _metadata_value(event.metadata.value_json)}, boundary=True)
    name = step_kind(event)
    payload = step_payload(event)
    if event.origin_run_id:
        payload.update(originRunId=event.origin_run_id, originAgent=event.origin_agent)
        return Record(name, payload, boundary=name in BOUNDARY_KINDS)
    status = terminal_status(event)
    return Record(name, payload, boundary=name in BOUNDARY_KINDS, terminal_status=status, model=_model_of(event))


_MAX_TS = (1 << 63) - 1


def event_ts(event: RunEvent) -> int:
    """`event`'s timestamp in epoch milliseconds (0 when it has none, or one SQLite cannot store)."""
    if not event.HasField("timestamp"):
        return 0
    ts = event.timestamp.seconds * 1000 + event.timestamp.nanos // 1_000_000
    return ts if 0 < ts <= _MAX_TS else 0


def dumps(payload: dict[str, Any]) -> str:
    """A payload as stored: JSON with sorted keys, ASCII only (its length is its size in bytes)."""
    return json.dumps(payload, sort_keys=True)


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What one event alone would be stored as, with no coalescing (for tests sizing replies)."""

    step: Step


def step_record(event: RunEvent) -> StepRecord:
    """`event` as a step of its own: its kind and payload as `step_kind` and `step_payload` say."""
    step = Step(event.run_id, event.seq, step_kind(event), dumps(step_payload(event)), event_ts(event))
    return StepRecord(step)
