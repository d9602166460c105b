"""Turning run events into tape steps, and answering tape queries.

Every answer fits in one bus message (`max_payload`): a run's steps come in pages (as many as
fit; `next_from_seq` says where the next page starts), a step whose payload alone would not fit
is sent with a stand-in payload naming its size (`payload_truncated`), and the run list is the
newest runs that fit (`truncated`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from google.protobuf.json_format import MessageToDict

from atmosphere.bus import MessageContext, Router, WorkItem, subjects
from atmosphere.bus.sizes import DEFAULT_MAX_PAYLOAD, REPLY_ROOM, reply_budget, utf8_len
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.contracts.tape.v1.tape_pb2 import (
    GetStepsRequest,
    GetStepsResponse,
    ListRunsRequest,
    ListRunsResponse,
    TapeRun,
    TapeStep,
)
from atmosphere.tape.errors import TapeBadRequestError
from atmosphere.tape.store import RunRow, Step, StepRecord, TapeStore

log = logging.getLogger("atmosphere.tape")

DEFAULT_MAX_STEPS = 500
MAX_STEPS = 5000
DEFAULT_MAX_RUNS = 100
MAX_RUNS = 1000
STATUSES = frozenset({"OPEN", "COMPLETED", "ERROR", "CANCELLED", "ABANDONED"})
MAX_ID_CHARS = 1024
"""The longest run or tape id accepted in a query."""
MAX_SEQ = (1 << 63) - 1
"""The largest seq SQLite can compare with (a larger `from_seq` is refused)."""
_ITEM_OVERHEAD = 16
"""Protobuf framing of one step or run in a reply."""


def _check_id(name: str, value: str) -> None:
    if len(value) > MAX_ID_CHARS:
        msg = f"{name} is {len(value)} characters; the limit is {MAX_ID_CHARS}"
        raise TapeBadRequestError(msg)


# Step kinds use the wire's event names; text deltas are recorded as "text" steps.
_KIND_NAMES = {"text_delta": "text"}
_TERMINAL_STATUS = {"complete": "COMPLETED", "error": "ERROR"}


def step_kind(event: RunEvent) -> str:
    """The step kind of `event`, e.g. "text", "tool-start", "complete"."""
    kind = event.WhichOneof("kind") or "unknown"
    return _KIND_NAMES.get(kind, kind.replace("_", "-"))


def step_payload(event: RunEvent) -> dict[str, Any]:
    """The JSON payload of `event`'s step; binary content is recorded as a descriptor only."""
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
        try:
            value = json.loads(event.metadata.value_json or "null")
        except json.JSONDecodeError:
            value = event.metadata.value_json
        return {"key": event.metadata.key, "value": value}
    return MessageToDict(getattr(event, kind), always_print_fields_with_no_presence=True)


def step_record(event: RunEvent) -> StepRecord:
    """What the store writes for `event`."""
    ts = event.timestamp.ToMilliseconds() if event.HasField("timestamp") else 0
    step = Step(
        run_id=event.run_id,
        seq=event.seq,
        kind=step_kind(event),
        payload=json.dumps(step_payload(event), sort_keys=True),
        ts=ts,
    )
    return StepRecord(
        step=step,
        tape_id=event.conversation_id,
        session_id=event.session_id,
        agent=event.agent,
        parent_run_id=event.parent_run_id,
        terminal_status=_TERMINAL_STATUS.get(event.WhichOneof("kind") or ""),
    )


def _run_message(row: RunRow) -> TapeRun:
    return TapeRun(
        run_id=row.run_id,
        tape_id=row.tape_id or "",
        session_id=row.session_id or "",
        agent=row.agent or "",
        parent_run_id=row.parent_run_id or "",
        status=row.status,
        started_at=row.started_at,
        ended_at=row.ended_at or 0,
        step_count=row.step_count,
    )


class TapeHandlers:
    """The recorder (fed by `ATMO_EVENTS`) and the query responders."""

    def __init__(self, store: TapeStore, *, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        """Record into and answer from `store`, each answer within `max_payload` bytes."""
        self._store = store
        self._reply_bytes = reply_budget(max_payload)

    async def record(self, items: list[WorkItem[RunEvent]]) -> None:
        """Record a batch of events in one transaction; a redelivered event is stored once.

        The batch is acked only after the commit, so an event is never acked before it is on
        disk; a failed commit redelivers the whole batch.
        """
        records: list[StepRecord] = []
        for item in items:
            event = item.envelope.message
            if not event.run_id or event.seq < 1:
                continue
            try:
                records.append(step_record(event))
            except Exception:
                # One event that cannot become a step must not hold back the batch (it would be
                # redelivered with it forever): it is logged and left out.
                log.exception("run %s: event %d cannot be recorded; skipped", event.run_id, event.seq)
        await self._store.record_many(records)

    async def get_steps(self, request: GetStepsRequest, _ctx: MessageContext) -> GetStepsResponse:
        """`atmo.tape.steps`: a run's steps from `from_seq`, at most `max` (capped), as many as fit in one reply."""
        _check_id("run_id", request.run_id)
        if request.from_seq > MAX_SEQ:
            msg = f"from_seq {request.from_seq} is out of range (at most {MAX_SEQ})"
            raise TapeBadRequestError(msg)
        limit = min(request.max or DEFAULT_MAX_STEPS, MAX_STEPS)
        if limit < 0:
            limit = DEFAULT_MAX_STEPS
        steps = await self._store.steps(request.run_id, from_seq=request.from_seq, limit=limit)
        response = GetStepsResponse(run_id=request.run_id)
        run = await self._store.run(request.run_id)
        if run is not None:
            response.run.CopyFrom(_run_message(run))
        room = self._reply_bytes - response.ByteSize()
        for step in steps:
            message = self._step_message(step)
            room -= message.ByteSize() + _ITEM_OVERHEAD
            if room < 0 and response.steps:  # the first step always goes (its payload fits alone)
                response.next_from_seq = step.seq
                break
            response.steps.append(message)
        response.count = len(response.steps)
        return response

    def _step_message(self, step: Step) -> TapeStep:
        """`step` as sent; a payload too large for a reply of its own is replaced by its size."""
        message = TapeStep(seq=step.seq, kind=step.kind, payload_json=step.payload, ts=step.ts)
        if message.ByteSize() + _ITEM_OVERHEAD > self._reply_bytes - REPLY_ROOM:
            size = utf8_len(step.payload)
            message.payload_json = json.dumps({"truncated": True, "bytes": size})
            message.payload_truncated = True
        return message

    async def list_runs(self, request: ListRunsRequest, _ctx: MessageContext) -> ListRunsResponse:
        """`atmo.tape.runs`: newest first, as many as fit in one reply; an unknown status filter means no filter."""
        _check_id("tape_id", request.tape_id)
        limit = request.limit if 0 < request.limit <= MAX_RUNS else DEFAULT_MAX_RUNS
        status = request.status.upper() if request.status.upper() in STATUSES else ""
        rows = await self._store.runs(tape_id=request.tape_id, status=status, limit=limit)
        response = ListRunsResponse()
        room = self._reply_bytes
        for row in rows:
            message = _run_message(row)
            room -= message.ByteSize() + _ITEM_OVERHEAD
            if room < 0:
                response.truncated = True
                break
            response.runs.append(message)
        return response

    def router(self) -> Router:
        """The tape's request/reply subjects."""
        router = Router()
        router.add(subjects.tape("steps"), GetStepsRequest, self.get_steps)
        router.add(subjects.tape("runs"), ListRunsRequest, self.list_runs)
        return router
