"""A run's events as AG-UI events: the translation, with nothing of HTTP in it.

    text_delta         TEXT_MESSAGE_START (once per message) + TEXT_MESSAGE_CONTENT
    tool_start         TOOL_CALL_START + TOOL_CALL_ARGS + TOOL_CALL_END (an open text message ends first)
    tool_result/error  TOOL_CALL_RESULT (an error's text starts with "Error: ")
    plan_update        STATE_SNAPSHOT `{"plan": ...}` the first time, a STATE_DELTA replacing `/plan` after
    approval_required  CUSTOM "approval-required", then RUN_FINISHED with an `interrupt` outcome
    progress           CUSTOM "progress"
    complete           RUN_FINISHED (usage summed), error: RUN_ERROR (its code)

A sub-agent's events (`delegate_task`, `task`) carry its run id as `subagentRunId`. An interrupt's
id holds what its answer needs: `<approval id>:<seq>:<run id>` (resume after that seq).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ag_ui.core import (
    BaseEvent,
    CustomEvent,
    Interrupt,
    RunErrorEvent,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    StateDeltaEvent,
    StateSnapshotEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    TokenUsage,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)
from google.protobuf.json_format import MessageToDict

from atmosphere.bus import subjects
from atmosphere.contracts.run.v1.run_pb2 import RunEvent

APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approve": {"type": "boolean", "title": "Approve this tool call?"},
        "arguments": {"type": "object", "description": "The tool's arguments, edited (optional)."},
    },
    "required": ["approve"],
}


@dataclass(frozen=True)
class InterruptRef:
    """What an interrupt's id says: the approval asked, the seq that asked it, the run waiting."""

    approval_id: str
    seq: int
    run_id: str

    def encode(self) -> str:
        return f"{self.approval_id}:{self.seq}:{self.run_id}"

    @classmethod
    def decode(cls, raw: str) -> InterruptRef | None:
        approval_id, _, rest = raw.partition(":")
        seq, _, run_id = rest.partition(":")
        if not approval_id.startswith("apr_") or not seq.isdigit() or len(seq) > 15:
            return None
        try:
            subjects.token(run_id, what="run id")
            subjects.token(approval_id, what="approval id")
        except ValueError:
            return None
        return cls(approval_id, int(seq), run_id)


@dataclass
class AgUiTranslation:
    """One run's events in, AG-UI events out; `finished` once the run's last AG-UI event went out."""

    thread_id: str
    run_id: str
    """The AG-UI run id (the client's), not ours."""
    _message_id: str | None = None
    _plan: dict[str, Any] | None = None
    _input_tokens: int = 0
    _output_tokens: int = 0
    finished: bool = False
    interrupted: bool = False
    """The run waits for an approval the client answers by resuming (`RunAgentInput.resume`)."""

    def events(self, event: RunEvent) -> list[BaseEvent]:
        """The AG-UI events `event` becomes (none for what AG-UI has no place for)."""
        kind = event.WhichOneof("kind") or ""
        sub = event.origin_run_id or None
        translate = _TRANSLATIONS.get(kind)
        if translate is None or (sub and kind in RUN_SCOPED):
            return []
        return translate(self, event, sub)

    def _on_text(self, event: RunEvent, sub: str | None) -> list[BaseEvent]:
        return self._text(event.text_delta.text, sub)

    def _on_tool_start(self, event: RunEvent, sub: str | None) -> list[BaseEvent]:
        start = event.tool_start
        return [
            *self._end_text(),
            ToolCallStartEvent(tool_call_id=start.call_id, tool_call_name=start.tool_name, subagent_run_id=sub),
            ToolCallArgsEvent(tool_call_id=start.call_id, delta=start.arguments_json or "{}", subagent_run_id=sub),
            ToolCallEndEvent(tool_call_id=start.call_id, subagent_run_id=sub),
        ]

    def _on_tool_result(self, event: RunEvent, sub: str | None) -> list[BaseEvent]:
        return [*self._end_text(), self._result(event.tool_result.call_id, event.tool_result.result, sub)]

    def _on_tool_error(self, event: RunEvent, sub: str | None) -> list[BaseEvent]:
        error = event.tool_error
        return [*self._end_text(), self._result(error.call_id, f"Error: {error.error}", sub)]

    def _on_progress(self, event: RunEvent, sub: str | None) -> list[BaseEvent]:
        return [CustomEvent(name="progress", value={"message": event.progress.message}, subagent_run_id=sub)]

    def _on_usage(self, event: RunEvent, sub: str | None) -> list[BaseEvent]:
        del sub
        self._input_tokens += event.usage.input_tokens
        self._output_tokens += event.usage.output_tokens
        return []

    def _on_complete(self, event: RunEvent, sub: str | None) -> list[BaseEvent]:
        del event, sub
        self.finished = True
        finished = RunFinishedEvent(thread_id=self.thread_id, run_id=self.run_id, usage=self._usage())
        return [*self._end_text(), finished]

    def _on_error(self, event: RunEvent, sub: str | None) -> list[BaseEvent]:
        del sub
        self.finished = True
        return [*self._end_text(), RunErrorEvent(message=event.error.message, code=event.error.code)]

    def _text(self, text: str, sub: str | None) -> list[BaseEvent]:
        if not text:
            return []
        out: list[BaseEvent] = []
        if self._message_id is None:
            self._message_id = uuid.uuid4().hex
            out.append(TextMessageStartEvent(message_id=self._message_id, role="assistant", subagent_run_id=sub))
        out.append(TextMessageContentEvent(message_id=self._message_id, delta=text, subagent_run_id=sub))
        return out

    def _end_text(self) -> list[BaseEvent]:
        if self._message_id is None:
            return []
        ended = TextMessageEndEvent(message_id=self._message_id)
        self._message_id = None
        return [ended]

    def _result(self, call_id: str, content: str, sub: str | None) -> ToolCallResultEvent:
        return ToolCallResultEvent(
            message_id=uuid.uuid4().hex, tool_call_id=call_id, content=content, role="tool", subagent_run_id=sub
        )

    def _plan_state(self, event: RunEvent, sub: str | None) -> list[BaseEvent]:
        del sub
        plan = MessageToDict(event.plan_update, preserving_proto_field_name=False)
        plan = {"goal": plan.get("goal", ""), "steps": plan.get("steps", [])}
        if self._plan is None:
            self._plan = plan
            return [StateSnapshotEvent(snapshot={"plan": plan})]
        self._plan = plan
        # A JSON Patch (RFC 6902) op, validated into the SDK's own operation model.
        return [StateDeltaEvent.model_validate({"delta": [{"op": "replace", "path": "/plan", "value": plan}]})]

    def _interrupt(self, event: RunEvent, sub: str | None) -> list[BaseEvent]:
        del sub
        approval = event.approval_required
        ref = InterruptRef(approval.approval_id, event.seq, event.run_id)
        try:
            arguments = json.loads(approval.arguments_json or "{}")
        except ValueError:
            arguments = approval.arguments_json
        asked = {
            "interruptId": ref.encode(),
            "approvalId": approval.approval_id,
            "toolName": approval.tool_name,
            "toolCallId": approval.call_id,
            "arguments": arguments,
            "message": approval.message,
            "expiresIn": approval.expires_in_seconds,
        }
        message = approval.message or f"Approve the call of '{approval.tool_name}'?"
        interrupt = Interrupt(
            id=ref.encode(),
            reason="tool_approval",
            message=message,
            tool_call_id=approval.call_id or None,
            response_schema=APPROVAL_SCHEMA,
            subagent_run_id=event.origin_run_id or None,
        )
        self.finished = True
        self.interrupted = True
        return [
            *self._end_text(),
            CustomEvent(name="approval-required", value=asked),
            RunFinishedEvent(
                thread_id=self.thread_id,
                run_id=self.run_id,
                outcome=RunFinishedInterruptOutcome(interrupts=[interrupt]),
                usage=self._usage(),
            ),
        ]

    def _usage(self) -> list[TokenUsage] | None:
        if not (self._input_tokens or self._output_tokens):
            return None
        total = self._input_tokens + self._output_tokens
        return [TokenUsage(input_tokens=self._input_tokens, output_tokens=self._output_tokens, total_tokens=total)]


RUN_SCOPED = frozenset({"plan_update", "usage", "complete", "error"})
"""Kinds that are the run's own: a sub-agent's (forwarded into the stream) has no AG-UI place."""

_TRANSLATIONS: dict[str, Callable[[AgUiTranslation, RunEvent, str | None], list[BaseEvent]]] = {
    "text_delta": AgUiTranslation._on_text,
    "tool_start": AgUiTranslation._on_tool_start,
    "tool_result": AgUiTranslation._on_tool_result,
    "tool_error": AgUiTranslation._on_tool_error,
    "plan_update": AgUiTranslation._plan_state,
    "progress": AgUiTranslation._on_progress,
    "usage": AgUiTranslation._on_usage,
    "approval_required": AgUiTranslation._interrupt,
    "complete": AgUiTranslation._on_complete,
    "error": AgUiTranslation._on_error,
}
