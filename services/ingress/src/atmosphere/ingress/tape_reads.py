"""Reading the tape for HTTP: the admin's reads (`admin_api.py`) and a user's own (`my_runs.py`).

One definition of what both answer: a run, a page of steps and a replayed tree as JSON, the
list filters (`agent`, `user`, `since`, `until`, `status`, `limit`) and how a malformed one is
refused. The routes differ only in who may ask and whose runs they reach: the admin's read every
run, a user's name its owner in the request, so the tape itself never answers another's run.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Query

from atmosphere.bus import Bus, subjects
from atmosphere.contracts.tape.v1.tape_pb2 import (
    GetStepsRequest,
    GetStepsResponse,
    ListRunsRequest,
    ListRunsResponse,
    ReplayedRun,
    ReplayRequest,
    ReplayResponse,
    TapeRun,
    TapeStep,
)
from atmosphere.ingress.errors import IngressError
from atmosphere.ingress.http import OPTIONAL_ID, valid_id

MAX_SEQ = 2**53
MAX_STEPS = 5000
MAX_RUNS = 1000
MAX_TIME_MS = 253_402_300_799_999
"""The last millisecond of the year 9999: a later `since` or `until` is refused (400)."""
MAX_OWNER_CHARS = 256
"""As long as a grant's user id may be."""
OWNER_PATTERN = r"^[^\x00-\x1f\x7f]*$"
"""A user id may hold any character but control characters (quotes and SQL's metacharacters
included: the tape matches it as a parameter, never as SQL)."""

AgentFilter = Annotated[
    str,
    Query(
        max_length=128,
        json_schema_extra={"pattern": OPTIONAL_ID},
        description="Only the runs of this agent (its name).",
    ),
]
SinceFilter = Annotated[
    int,
    Query(ge=0, le=MAX_TIME_MS, description="Only runs started at or after this time (epoch ms; 0: unbounded)."),
]
UntilFilter = Annotated[
    int,
    Query(ge=0, le=MAX_TIME_MS, description="Only runs started before this time (epoch ms, exclusive; 0: unbounded)."),
]
UserFilter = Annotated[
    str,
    Query(
        max_length=MAX_OWNER_CHARS,
        pattern=OWNER_PATTERN,
        description="Only the runs of this user (the user id of the token that started them), matched exactly.",
    ),
]
Status = Literal[
    "",
    "OPEN",
    "COMPLETED",
    "INCOMPLETE",
    "ERROR",
    "CANCELLED",
    "ABANDONED",
    "open",
    "completed",
    "incomplete",
    "error",
    "cancelled",
    "abandoned",
]
"""A run status filter (`STATUSES`, in either case; empty: any)."""
StatusFilter = Annotated[Status, Query(description="Only the runs in this status (any: empty).")]
Limit = Annotated[int, Query(ge=1, le=MAX_RUNS, description="At most this many runs, newest first.")]
FromSeq = Annotated[int, Query(ge=0, le=MAX_SEQ, description="Steps from this seq on.")]
MaxSteps = Annotated[int, Query(ge=1, le=MAX_STEPS, description="At most this many steps.")]


def list_request(
    *,
    bad_request: type[IngressError],
    limit: int,
    status: str = "",
    tape_id: str = "",
    agent: str = "",
    owner: str = "",
    since: int = 0,
    until: int = 0,
) -> ListRunsRequest:
    """The tape's list request for these filters; `bad_request` when an id filter is malformed.

    A user id (`owner`) is any text a grant may name: it is never checked as an id, only passed on.
    """
    if tape_id and not valid_id(tape_id):
        raise bad_request("Malformed tapeId")
    if agent and not valid_id(agent):
        raise bad_request("Malformed agent")
    return ListRunsRequest(
        tape_id=tape_id,
        status=status,
        limit=limit,
        owner=owner,
        agent=agent,
        started_after=since,
        started_before=until,
    )


async def list_runs(bus: Bus, request: ListRunsRequest, *, timeout: float) -> list[TapeRun]:
    """The runs the tape lists for `request`, newest first."""
    reply = await bus.request(subjects.tape("runs"), request, ListRunsResponse, timeout=timeout)
    return list(reply.runs)


async def read_steps(bus: Bus, request: GetStepsRequest, *, timeout: float) -> GetStepsResponse:
    """A page of a run's steps (`run` absent when the tape has no such run, or none of `request.owner`'s)."""
    return await bus.request(subjects.tape("steps"), request, GetStepsResponse, timeout=timeout)


async def read_replay(bus: Bus, request: ReplayRequest, *, timeout: float) -> ReplayResponse:
    """A replayed tree (`present` false when the tape has no such run, or none of `request.owner`'s)."""
    return await bus.request(subjects.tape("replay"), request, ReplayResponse, timeout=timeout)


def run_row(run: TapeRun) -> dict[str, Any]:
    """A run as listed.

    `{runId, tapeId, parentRunId, status, agent, owner, model, runtime, endpoint, startedAt,
    endedAt, stepCount, droppedSteps, truncated}`.
    """
    return {
        "runId": run.run_id,
        "tapeId": run.tape_id,
        "parentRunId": run.parent_run_id or None,
        "status": run.status,
        "agent": run.agent,
        "owner": run.owner or None,
        "model": run.model or None,
        "runtime": run.runtime or None,
        "endpoint": run.endpoint or None,
        "startedAt": run.started_at,
        "endedAt": run.ended_at or None,
        "stepCount": run.step_count,
        "droppedSteps": run.dropped_steps,
        "truncated": run.truncated,
    }


def _step(step: TapeStep) -> dict[str, Any]:
    shown: dict[str, Any] = {"seq": step.seq, "kind": step.kind, "payload": step.payload_json, "ts": step.ts}
    if step.payload_truncated:
        shown["payloadTruncated"] = True
    return shown


def steps_page(reply: GetStepsResponse) -> dict[str, Any]:
    """`{runId, steps: [{seq, kind, payload, ts, payloadTruncated?}], count, run, nextFromSeq?}` of a known run."""
    page: dict[str, Any] = {
        "runId": reply.run_id,
        "steps": [_step(s) for s in reply.steps],
        "count": reply.count,
        "run": run_row(reply.run),
    }
    if reply.next_from_seq:
        page["nextFromSeq"] = reply.next_from_seq
    return page


def _replayed(run: ReplayedRun) -> dict[str, Any]:
    shown: dict[str, Any] = {
        "runId": run.run_id,
        "parentRunId": run.parent_run_id or None,
        "status": run.status,
        "model": run.model or None,
        "runtime": run.runtime or None,
        "endpoint": run.endpoint or None,
        "startedAt": run.started_at,
        "endedAt": run.ended_at or None,
        "input": [{"role": m.role, "content": m.content} for m in run.input],
        "output": run.output,
        "tools": [{"name": t.name, "arguments": t.arguments} for t in run.tools],
    }
    # What the tape left out so that the answer fits in one bus message, only when something was.
    if run.input_omitted:
        shown["inputOmitted"] = run.input_omitted
    if run.tools_omitted:
        shown["toolsOmitted"] = run.tools_omitted
    if run.clipped:
        shown["clipped"] = True
    return shown


def replay_tree(reply: ReplayResponse) -> dict[str, Any]:
    """`{present: true, runCount, root, children, childrenOmitted?}` of a present run."""
    tree: dict[str, Any] = {
        "present": True,
        "runCount": reply.run_count,
        "root": _replayed(reply.root),
        "children": [_replayed(c) for c in reply.children],
    }
    if reply.children_omitted:
        tree["childrenOmitted"] = reply.children_omitted
    return tree
