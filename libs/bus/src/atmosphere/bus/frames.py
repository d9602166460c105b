"""The one translation from `RunEvent` to the client's JSON frame (Atmosphere's wire format).

Ingress sends these frames to its WebSocket, SSE and long-poll clients; `atmosphere.testing`
hands the same frames to an agent's test. It lives beside the run events (`atmosphere.bus.runs`)
so that both read one translation.

Two families share the channel, as in Atmosphere: legacy `type` frames (`streaming-text`,
`progress`, `metadata`, `content`, `complete`, `error`) and typed `event` frames
(`tool-start`, `plan-update`, ...). Every frame carries `sessionId` and `seq`; one event is
exactly one frame, so `seq` is the event's own and a resumed stream lines up with it.

Deliberate differences from the Java original: error frames keep `code` and `recoverable`
beside `data` (Java dropped them), plus `details` when the run's error has any (e.g. the model
provider's `status` and `provider_code`); `complete` frames carry `finishReason` (`stop`,
`length`, `content_filter`) when the model said why it stopped; and usage / confidence travel
as typed `usage` / `confidence` events instead of several `ai.tokens.*` metadata frames, so
that one event stays one frame.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

from atmosphere.bus.runs import SERVER_SIDE_KINDS
from atmosphere.contracts.run.v1.run_pb2 import RunEvent

Frame = dict[str, Any]


def _json(text: str) -> Any:
    """Parse a `*_json` field; text that is not JSON is passed on as a string."""
    if not text:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _typed(name: str, data: dict[str, Any]) -> Frame:
    return {"event": name, "data": data}


def _text_delta(e: RunEvent) -> Frame:
    return {"type": "streaming-text", "data": e.text_delta.text}


def _progress(e: RunEvent) -> Frame:
    p = e.progress
    if p.HasField("percentage"):
        return _typed("progress", {"message": p.message, "percentage": p.percentage})
    return {"type": "progress", "data": p.message}


def _metadata(e: RunEvent) -> Frame:
    return {"type": "metadata", "key": e.metadata.key, "value": _json(e.metadata.value_json)}


def _content(e: RunEvent) -> Frame:
    c = e.content
    frame: Frame = {
        "type": "content",
        "contentType": c.content_type,
        "mimeType": c.mime_type,
        "data": base64.b64encode(c.data).decode("ascii"),
    }
    if c.content_type == "file":
        frame["fileName"] = c.file_name
    return frame


def _complete(e: RunEvent) -> Frame:
    frame: Frame = {"type": "complete"}
    if e.complete.summary:
        frame["data"] = e.complete.summary
    if e.complete.finish_reason:
        # `stop`, or why the answer is cut short (`length`, `content_filter`): a truncated
        # answer must never pass for a finished one.
        frame["finishReason"] = e.complete.finish_reason
    return frame


def _error(e: RunEvent) -> Frame:
    err = e.error
    frame: Frame = {"type": "error", "data": err.message, "code": err.code, "recoverable": err.retryable}
    if err.details:
        frame["details"] = dict(err.details)
    return frame


def _tool_call_delta(e: RunEvent) -> Frame:
    d = e.tool_call_delta
    return {"type": "metadata", "key": f"ai.toolCall.delta.{d.call_id}", "value": d.arguments_fragment}


def _usage(e: RunEvent) -> Frame:
    u = e.usage
    return _typed(
        "usage",
        {
            "input": u.input_tokens,
            "output": u.output_tokens,
            "cachedInput": u.cached_input_tokens,
            "total": u.total_tokens,
            "model": u.model or None,
        },
    )


def _confidence(e: RunEvent) -> Frame:
    c = e.confidence
    aggregate = c.aggregate if c.HasField("aggregate") else None
    return _typed("confidence", {"aggregate": aggregate, "source": c.source, "tokens": c.token_count})


def _plan_update(e: RunEvent) -> Frame:
    p = e.plan_update
    steps = [
        {"content": s.content, "status": s.status, **({"activeForm": s.active_form} if s.active_form else {})}
        for s in p.steps
    ]
    return _typed(
        "plan-update",
        {
            "steps": steps,
            "goal": p.goal if p.HasField("goal") else None,
            "conversationId": p.conversation_id,
            "agentId": p.agent_id,
        },
    )


def _approval(e: RunEvent) -> Frame:
    a = e.approval_required
    return _typed(
        "approval-required",
        {
            "approvalId": a.approval_id,
            "toolName": a.tool_name,
            "arguments": _json(a.arguments_json),
            "message": a.message,
            "expiresIn": a.expires_in_seconds,
            **({"callId": a.call_id} if a.call_id else {}),
        },
    )


_TRANSLATORS: dict[str, Callable[[RunEvent], Frame]] = {
    "text_delta": _text_delta,
    "progress": _progress,
    "metadata": _metadata,
    "content": _content,
    "complete": _complete,
    "error": _error,
    "tool_call_delta": _tool_call_delta,
    "usage": _usage,
    "confidence": _confidence,
    "plan_update": _plan_update,
    "approval_required": _approval,
    "text_complete": lambda e: _typed("text-complete", {"fullText": e.text_complete.full_text}),
    "tool_start": lambda e: _typed(
        "tool-start", {"toolName": e.tool_start.tool_name, "arguments": _json(e.tool_start.arguments_json)}
    ),
    "tool_result": lambda e: _typed(
        "tool-result", {"toolName": e.tool_result.tool_name, "result": e.tool_result.result}
    ),
    "tool_error": lambda e: _typed("tool-error", {"toolName": e.tool_error.tool_name, "error": e.tool_error.error}),
    "agent_step": lambda e: _typed(
        "agent-step",
        {
            "stepName": e.agent_step.step_name,
            "description": e.agent_step.description,
            "data": _json(e.agent_step.data_json),
        },
    ),
    "reasoning_delta": lambda e: _typed(
        "reasoning-delta", {"text": e.reasoning_delta.text, "redacted": e.reasoning_delta.redacted}
    ),
    "reasoning_complete": lambda e: _typed("reasoning-complete", {"signature": e.reasoning_complete.signature}),
    "handoff": lambda e: _typed(
        "handoff", {"fromAgent": e.handoff.from_agent, "toAgent": e.handoff.to_agent, "reason": e.handoff.reason}
    ),
    "structured_field": lambda e: _typed(
        "structured-field",
        {
            "fieldName": e.structured_field.field_name,
            "value": _json(e.structured_field.value_json),
            "schemaType": e.structured_field.schema_type,
        },
    ),
    "entity_start": lambda e: _typed(
        "entity-start", {"typeName": e.entity_start.type_name, "jsonSchema": _json(e.entity_start.json_schema)}
    ),
    "entity_complete": lambda e: _typed(
        "entity-complete", {"typeName": e.entity_complete.type_name, "entity": _json(e.entity_complete.entity_json)}
    ),
    "routing_decision": lambda e: _typed(
        "routing-decision",
        {
            "fromBackend": e.routing_decision.from_backend,
            "toBackend": e.routing_decision.to_backend,
            "reason": e.routing_decision.reason,
        },
    ),
    "citation": lambda e: _typed(
        "citation",
        {
            "text": e.citation.text,
            "start": e.citation.start,
            "end": e.citation.end,
            "sources": list(e.citation.sources),
        },
    ),
}


def to_frame(event: RunEvent) -> Frame | None:
    """The client frame of `event`, or None for an event without a kind or one kept server-side.

    `input` (what the model was given, system prompt included) is for the tape and the journal:
    clients never see it, so their frame seqs skip its seq.
    """
    kind = event.WhichOneof("kind")
    if kind is None or kind in SERVER_SIDE_KINDS:
        return None
    if event.origin_run_id:
        # A sub-agent's event inside its parent's stream. Its text is a typed `text-delta`, so a
        # client that concatenates `streaming-text` frames never mixes it into the answer.
        frame = (
            _typed("text-delta", {"text": event.text_delta.text}) if kind == "text_delta" else _TRANSLATORS[kind](event)
        )
        frame["runId"] = event.origin_run_id
        frame["parentRunId"] = event.run_id
        frame["agent"] = event.origin_agent
    else:
        frame = _TRANSLATORS[kind](event)
    frame["sessionId"] = event.session_id
    frame["seq"] = event.seq
    return frame
