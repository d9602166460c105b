"""Runtime truth and admin reads: `/api/console/info` and `/api/admin/*`.

Admin reads are proxied over the bus to the service that owns the data (governance's surface,
its changes included, is `governance_admin.py`; the workspaces' is `workspace_api.py`). The answers say
precisely what went wrong: 400 for a malformed (traversal-shaped) id, 404 when the owning
service is absent (nobody serves the subject), 503 when it does not answer in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Annotated, Any, NoReturn

from fastapi import APIRouter, Path, Query, Request
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from atmosphere.bus import Bus, BusError, subjects
from atmosphere.contracts.common.v1.service_pb2 import ServiceInfoRequest, ServiceInfoResponse
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.tape.v1.tape_pb2 import GetStepsRequest, ReplayRequest
from atmosphere.contracts.tool.v1.tool_pb2 import ToolDescriptor
from atmosphere.ingress.errors import (
    AdminBadRequestError,
    AdminNotFoundError,
    AdminUnknownRunError,
)
from atmosphere.ingress.http import ADMIN_ERRORS, OPTIONAL_ID, admin_call, admin_timeout, state_of, valid_id
from atmosphere.ingress.tape_reads import (
    AgentFilter,
    FromSeq,
    Limit,
    MaxSteps,
    SinceFilter,
    UntilFilter,
    UserFilter,
    list_request,
    list_runs,
    read_replay,
    read_steps,
    replay_tree,
    run_row,
    steps_page,
)

ID_PATTERN = r"^[A-Za-z0-9_\-:@]{1,128}$"
"""What a run, tape or conversation id may look like; anything else is answered with 400."""

SERVICES = ("ingress", "dispatch", "sandbox", "governance", "memory", "tape")
INFO_TIMEOUT = 1.0

router = APIRouter()


def _merge(into: dict[str, Any], fragment: dict[str, Any]) -> None:
    for key, value in fragment.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


async def _info(bus: Bus, service: str) -> dict[str, Any] | None:
    try:
        reply = await bus.request(
            subjects.service_info(service), ServiceInfoRequest(), ServiceInfoResponse, timeout=INFO_TIMEOUT
        )
    except BusError:
        return None
    fragment = json.loads(reply.info_json or "{}")
    return fragment if isinstance(fragment, dict) else None


@router.get("/api/console/info", summary="What is running now (runtime truth)")
async def console_info(request: Request) -> dict[str, Any]:
    """Each service's fragment, merged; a block appears only when its service says it is active."""
    bus = state_of(request).bus
    fragments = await asyncio.gather(*(_info(bus, s) for s in SERVICES))
    merged: dict[str, Any] = {}
    for fragment in fragments:
        if fragment:
            _merge(merged, fragment)
    merged["services"] = [s for s, f in zip(SERVICES, fragments, strict=True) if f is not None]
    with contextlib.suppress(BusError):
        # Every dispatch pool that serves agents now, each in its own words (the `dispatch` block
        # above is whichever dispatch answered first).
        merged["pools"] = runtime_pools(await state_of(request).directory.all())
    return merged


def runtime_pools(agents: list[AgentDescriptor]) -> dict[str, dict[str, Any]]:
    """The `pools` block: each pool serving agents now, its runtime's state and what it can do.

    From the agents' descriptors, which each pool keeps alive: a pool that stopped drops out with
    them; one whose runtime cannot run says why (`INACTIVE(<why>)`). The default pool is `default`.
    """
    pools: dict[str, dict[str, Any]] = {}
    for agent in agents:
        pool = pools.setdefault(
            agent.pool or "default",
            {
                "runtime": agent.runtime or None,
                "state": agent.runtime_state or ("ACTIVE" if agent.runtime else "INACTIVE"),
                "capabilities": list(agent.capabilities),
                "agents": [],
            },
        )
        pool["agents"].append(agent.name)
    return dict(sorted(pools.items()))


def _dict(message: Message) -> dict[str, Any]:
    return MessageToDict(message, always_print_fields_with_no_presence=True)


@router.get("/api/admin/agents", summary="Agents and their runtime truth", responses=ADMIN_ERRORS)
async def admin_agents(request: Request) -> Any:
    """The `ATMO_AGENTS` descriptors."""

    async def ask(bus: Bus) -> list[dict[str, Any]]:
        items = await bus.kv_items(subjects.AGENTS_BUCKET, AgentDescriptor)
        return [_dict(items[k]) for k in sorted(items)]

    return await admin_call(request, "dispatch", ask)


@router.get("/api/admin/tools", summary="Tools and their schemas", responses=ADMIN_ERRORS)
async def admin_tools(request: Request) -> Any:
    """The `ATMO_TOOLS` descriptors."""

    async def ask(bus: Bus) -> list[dict[str, Any]]:
        items = await bus.kv_items(subjects.TOOLS_BUCKET, ToolDescriptor)
        return [_dict(items[k]) for k in sorted(items)]

    return await admin_call(request, "sandbox", ask)


@router.get("/api/admin/tape/runs", summary="Recorded runs, newest first", responses=ADMIN_ERRORS)
async def admin_tape_runs(
    request: Request,
    *,
    tapeId: Annotated[str, Query(max_length=128, json_schema_extra={"pattern": OPTIONAL_ID})] = "",  # noqa: N803
    status: Annotated[str, Query(max_length=32)] = "",
    limit: Limit = 100,
    agent: AgentFilter = "",
    user: UserFilter = "",
    since: SinceFilter = 0,
    until: UntilFilter = 0,
) -> Any:
    """Every user's runs, newest first, as many as fit in one bus message.

    `[{runId, tapeId, parentRunId, status, agent, owner, model, runtime, endpoint, startedAt,
    endedAt, stepCount, droppedSteps, truncated}]`; `owner` is the user id of the token that
    started the run (null: anonymous, or recorded before the tape stored owners).

    Filters, all optional and combined: `tapeId`, `status` (an unknown one: no filter), `agent`
    (its name), `user` (an owner's user id, matched exactly), `since` and `until` (epoch ms of
    the start: `since` inclusive, `until` exclusive). A malformed one is answered 400.
    """
    tape_request = list_request(
        bad_request=AdminBadRequestError,
        limit=limit,
        status=status,
        tape_id=tapeId,
        agent=agent,
        owner=user,
        since=since,
        until=until,
    )

    async def ask(bus: Bus) -> list[dict[str, Any]]:
        return [run_row(r) for r in await list_runs(bus, tape_request, timeout=admin_timeout(request))]

    return await admin_call(request, "tape", ask)


@router.get("/api/admin/tape/runs/{run_id}/steps", summary="The recorded steps of a run", responses=ADMIN_ERRORS)
async def admin_tape_steps(
    request: Request,
    run_id: Annotated[str, Path(json_schema_extra={"pattern": ID_PATTERN})],
    fromSeq: FromSeq = 0,  # noqa: N803
    max: MaxSteps = 500,
) -> Any:
    """`{runId, steps: [{seq, kind, payload, ts}], count, run, nextFromSeq?}`.

    A reply holds what fits in one bus message: `nextFromSeq`, when present, is the `fromSeq` of
    the next page. A step too large for any page has `payloadTruncated: true`. `run` is the run
    as the list shows it.
    """
    if not valid_id(run_id):
        raise AdminBadRequestError("Malformed run id")

    async def ask(bus: Bus) -> Any:
        tape_request = GetStepsRequest(run_id=run_id, from_seq=fromSeq, max=max)
        reply = await read_steps(bus, tape_request, timeout=admin_timeout(request))
        if not reply.HasField("run"):
            raise AdminUnknownRunError(f"The tape has no run {run_id}")
        return steps_page(reply)

    return await admin_call(request, "tape", ask)


@router.get(
    "/api/admin/tape/runs/{run_id}/replay",
    summary="A run and the runs it started, rebuilt",
    responses=ADMIN_ERRORS,
)
async def admin_tape_replay(
    request: Request, run_id: Annotated[str, Path(json_schema_extra={"pattern": ID_PATTERN})]
) -> Any:
    """`{present: true, runCount, root, children}`, or `{runId, present: false}` for a run the tape does not have.

    Each run is `{runId, parentRunId, status, model, runtime, endpoint, startedAt, endedAt,
    input: [{role, content}], output, tools: [{name, arguments}]}`, rebuilt from its steps (no
    model is called): the first input, its own text, its tool calls. `children` are the runs it
    started, oldest first (not theirs). Too large for one answer, a run says what it left out
    (`inputOmitted`, `toolsOmitted`, `clipped`) and the reply how many children (`childrenOmitted`).
    """
    if not valid_id(run_id):
        raise AdminBadRequestError("Malformed run id")

    async def ask(bus: Bus) -> Any:
        reply = await read_replay(bus, ReplayRequest(run_id=run_id), timeout=admin_timeout(request))
        if not reply.present:
            return {"runId": run_id, "present": False}
        return replay_tree(reply)

    return await admin_call(request, "tape", ask)


def refuse_unknown_admin_path(request: Request, rest: str) -> NoReturn:
    """Anything under `/api/admin/` that no admin route serves: 400 when it is traversal-shaped, else 404.

    Registered by the app (`api.py`) for every method after all admin routes, so that a wrong
    method on a known path is answered 405 there first, and no method here adds to its `Allow`.
    """
    raw = request.scope.get("raw_path", b"").decode("latin-1").lower()
    if ".." in rest or "\\" in rest or "%2f" in raw or "%5c" in raw or "\x00" in rest:
        raise AdminBadRequestError("Malformed admin path")
    raise AdminNotFoundError(f"No admin surface at /api/admin/{rest}")
