"""The tape's bus side: recording the batches `ATMO_EVENTS` delivers, and answering tape queries.

Every answer fits in one bus message (`max_payload`): a run's steps come in pages (as many as
fit; `next_from_seq` says where the next page starts), a step whose payload alone would not fit
is sent with a stand-in payload naming its size (`payload_truncated`), the run list is the
newest runs that fit (`truncated`), and a replay shrinks what would not fit (`replay_reply`).

A query naming an `owner` reads only that owner's runs: a steps or replay request for any other
run is answered exactly as one for a run the tape never saw, so it cannot tell the two apart.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable

from atmosphere.bus import MessageContext, Router, WorkItem, subjects
from atmosphere.bus.sizes import DEFAULT_MAX_PAYLOAD, REPLY_ROOM, reply_budget, utf8_len
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.contracts.tape.v1.tape_pb2 import (
    GetStepsRequest,
    GetStepsResponse,
    ListRunsRequest,
    ListRunsResponse,
    ReplayRequest,
    ReplayResponse,
    TapeRun,
    TapeStep,
)
from atmosphere.tape import metrics
from atmosphere.tape.errors import TapeBadRequestError
from atmosphere.tape.recorder import MAX_SEQ, Recorder
from atmosphere.tape.replay import reconstruct_tree
from atmosphere.tape.replay_reply import replay_response
from atmosphere.tape.steps import step_kind, step_payload, step_record
from atmosphere.tape.store import RunFilter, RunRow, Step, TapeStore

DEFAULT_MAX_STEPS = 500
MAX_STEPS = 5000
DEFAULT_MAX_RUNS = 100
MAX_RUNS = 1000
STATUSES = frozenset({"OPEN", "COMPLETED", "INCOMPLETE", "ERROR", "CANCELLED", "ABANDONED"})
MAX_ID_CHARS = 1024
"""The longest run, tape or agent id, or owner, accepted in a query."""
_ITEM_OVERHEAD = 16
"""Protobuf framing of one step or run in a reply."""


def _check_id(name: str, value: str) -> None:
    if len(value) > MAX_ID_CHARS:
        msg = f"{name} is {len(value)} characters; the limit is {MAX_ID_CHARS}"
        raise TapeBadRequestError(msg)


def _check_time(name: str, value: int) -> None:
    if value < 0:
        msg = f"{name} is {value}; a time is epoch milliseconds (0: unbounded)"
        raise TapeBadRequestError(msg)


def run_filter(request: ListRunsRequest) -> RunFilter:
    """The filter a list request asks for (an unknown status: none); `TapeBadRequestError` when malformed."""
    for name, value in (("tape_id", request.tape_id), ("owner", request.owner), ("agent", request.agent)):
        _check_id(name, value)
    _check_time("started_after", request.started_after)
    _check_time("started_before", request.started_before)
    status = request.status.upper()
    return RunFilter(
        tape_id=request.tape_id,
        status=status if status in STATUSES else "",
        owner=request.owner,
        agent=request.agent,
        started_after=request.started_after,
        started_before=request.started_before,
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
        model=row.model,
        runtime=row.runtime,
        endpoint=row.endpoint,
        dropped_steps=row.dropped_steps,
        truncated=row.truncated,
        owner=row.owner,
    )


class TapeHandlers:
    """The recorder's entry point (fed by `ATMO_EVENTS`) and the query responders."""

    def __init__(
        self,
        store: TapeStore,
        *,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        recorder: Recorder | None = None,
        caught_up: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Record with `recorder` (default: one on `store`); answer from `store` within `max_payload` bytes.

        `caught_up` is awaited before every query: with several tape replicas, each recording
        the whole stream, it holds a query until this replica recorded every event stored
        before it (`atmosphere.service.replica`), so every replica gives the same answer.
        """
        self._store = store
        self._recorder = recorder or Recorder(store)
        self._reply_bytes = reply_budget(max_payload)
        self._caught_up = caught_up

    async def record(self, items: list[WorkItem[RunEvent]]) -> None:
        """Record a batch of events in one transaction; a redelivered event is recorded once.

        The batch is acked only after the commit, so an event is never acked before it is on
        disk; a failed commit redelivers the whole batch.
        """
        started = time.perf_counter()
        await self._recorder.record(item.envelope.message for item in items)
        # After the commit: a batch that failed is read again, and counted then.
        metrics.RECORD_DURATION.observe(time.perf_counter() - started)
        metrics.BATCH_SIZE.observe(len(items))
        metrics.EVENTS_RECORDED.inc(len(items))

    async def get_steps(self, request: GetStepsRequest, _ctx: MessageContext) -> GetStepsResponse:
        """`atmo.tape.steps`: a run's steps from `from_seq`, at most `max` (capped), as many as fit in one reply.

        With `owner`, another owner's run (or an ownerless one) is answered as an unknown run.
        """
        _check_id("run_id", request.run_id)
        _check_id("owner", request.owner)
        if request.from_seq > MAX_SEQ:
            msg = f"from_seq {request.from_seq} is out of range (at most {MAX_SEQ})"
            raise TapeBadRequestError(msg)
        limit = min(request.max or DEFAULT_MAX_STEPS, MAX_STEPS)
        if limit < 0:
            limit = DEFAULT_MAX_STEPS
        await self._wait_caught_up()
        response = GetStepsResponse(run_id=request.run_id)
        # The run first: another owner's steps are never read.
        run = await self._store.run(request.run_id, owner=request.owner)
        if run is not None:
            response.run.CopyFrom(_run_message(run))
        elif request.owner:
            return response
        steps = await self._store.steps(request.run_id, from_seq=request.from_seq, limit=limit)
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
        where = run_filter(request)
        limit = request.limit if 0 < request.limit <= MAX_RUNS else DEFAULT_MAX_RUNS
        await self._wait_caught_up()
        rows = await self._store.runs(where, limit=limit)
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

    async def replay(self, request: ReplayRequest, _ctx: MessageContext) -> ReplayResponse:
        """`atmo.tape.replay`: the run and the runs it started, rebuilt from their steps (no model call).

        With `owner`, another owner's run (or an ownerless one) is answered as an unknown run.
        """
        _check_id("run_id", request.run_id)
        _check_id("owner", request.owner)
        await self._wait_caught_up()
        tree = await reconstruct_tree(self._store, request.run_id, owner=request.owner)
        if tree is None:
            return ReplayResponse(run_id=request.run_id, present=False)
        return replay_response(tree, self._reply_bytes)

    async def _wait_caught_up(self) -> None:
        if self._caught_up is not None:
            await self._caught_up()

    def router(self) -> Router:
        """The tape's request/reply subjects."""
        router = Router()
        router.add(subjects.tape("steps"), GetStepsRequest, self.get_steps)
        router.add(subjects.tape("runs"), ListRunsRequest, self.list_runs)
        router.add(subjects.tape("replay"), ReplayRequest, self.replay)
        return router


__all__ = ["TapeHandlers", "step_kind", "step_payload", "step_record"]
