"""A user's own view, for a console: who the token is, the agents it may use, its own runs.

Every route is gated by the user's token (`identified_caller`: 401 when auth is on and none
valid was sent), never by the admin token, and reaches only what the token's principal owns:

* `/api/runs` asks the tape for the caller's runs only (`ListRunsRequest.owner`), then leaves
  out those whose agent the token's grant does not cover;
* a run's steps and replay name the caller as owner in the tape request, so the tape answers
  another user's run (or an ownerless one) exactly as a run it never saw; a run whose agent the
  grant does not cover is refused alike. Either is the 404 of an unknown run
  (`RunNotFoundError`), word for word, so run ids cannot be probed.

No-auth mode (no grants): every caller owns every run, so nothing is filtered by owner. The
rows are the admin's (`tape_reads.py`); the tape's failures are answered as the admin's are
(absent 404, unavailable 503), in ingress's own codes (`caller_call`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from atmosphere.bus import Bus, BusError
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.tape.v1.tape_pb2 import GetStepsRequest, ReplayRequest
from atmosphere.ingress.auth import Caller
from atmosphere.ingress.errors import MalformedRequestError, RunNotFoundError, UnavailableError
from atmosphere.ingress.http import admin_timeout, caller_call, error_responses, identified_caller, state_of, valid_id
from atmosphere.ingress.run_access import RunId
from atmosphere.ingress.tape_reads import (
    AgentFilter,
    FromSeq,
    Limit,
    MaxSteps,
    SinceFilter,
    StatusFilter,
    UntilFilter,
    list_request,
    list_runs,
    read_replay,
    read_steps,
    replay_tree,
    run_row,
    steps_page,
)

RETRY_AFTER = 2
"""Seconds a client is asked to wait when the agent directory cannot be read."""
CALLER_ERRORS = error_responses(400, 401, 404, 503)
"""What a user's read of the tape may answer besides its data."""

router = APIRouter()


def owner_filter(caller: Caller) -> str:
    """The owner the tape is asked for: the caller's user id, or none in no-auth mode (everything is theirs)."""
    return "" if caller.grant is None else caller.user_id


@router.get("/api/me", summary="Who the presented token is", responses=error_responses(401))
async def me(request: Request) -> dict[str, Any]:
    """`{authenticated, authRequired, userId, name, tenant, roles}` of the presented token (never the token).

    Without auth (no grants configured) every caller is anonymous: `authenticated` and
    `authRequired` are false, the rest null or empty. With auth, no token or an unknown one is 401.
    """
    state = state_of(request)
    caller = identified_caller(state, request)
    principal = caller.principal
    return {
        "authenticated": caller.grant is not None,
        "authRequired": state.authenticator.enabled,
        "userId": principal.user_id or None,
        "name": principal.name or None,
        "tenant": principal.tenant or None,
        "roles": list(principal.roles),
    }


def agent_row(agent: AgentDescriptor) -> dict[str, Any]:
    """An agent as `/api/agents` lists it."""
    return {
        "name": agent.name,
        "description": agent.description,
        "path": agent.path,
        "kind": agent.kind,
        "runtime": agent.runtime or None,
        "runtimeState": agent.runtime_state or ("ACTIVE" if agent.runtime else "INACTIVE"),
        "pool": agent.pool or "default",
        "capabilities": list(agent.capabilities),
        "tools": list(agent.tools),
        "harness": list(agent.harness),
    }


@router.get("/api/agents", summary="The agents this token may use", responses=error_responses(401, 503))
async def my_agents(request: Request) -> list[dict[str, Any]]:
    """`[{name, description, path, kind, runtime, runtimeState, pool, capabilities, tools, harness}]` by name.

    The agents some dispatch serves now whose path the token's grant covers (every one without
    auth); 503 when the agent directory cannot be read.
    """
    state = state_of(request)
    caller = identified_caller(state, request)
    try:
        agents = await state.directory.all()
    except BusError:
        msg = "The agent directory cannot be read right now; try again"
        raise UnavailableError(msg, retry_after=RETRY_AFTER) from None
    return [agent_row(a) for a in sorted(agents, key=lambda a: a.name) if caller.may_use(a.path)]


@router.get("/api/runs", summary="Your runs, newest first", responses=CALLER_ERRORS)
async def my_run_list(
    request: Request,
    *,
    agent: AgentFilter = "",
    status: StatusFilter = "",
    since: SinceFilter = 0,
    until: UntilFilter = 0,
    limit: Limit = 100,
) -> Any:
    """The caller's own runs, newest first: the rows of `/api/admin/tape/runs` (`owner` included).

    Filters, all optional and combined: `agent` (its name), `status`, `since` and `until`
    (epoch ms of the start: `since` inclusive, `until` exclusive). Runs of an agent the token's
    grant does not cover are left out after the tape's `limit`, so a page may hold fewer.
    """
    tape_request = list_request(
        bad_request=MalformedRequestError, limit=limit, status=status, agent=agent, since=since, until=until
    )

    async def ask(bus: Bus, caller: Caller) -> list[dict[str, Any]]:
        tape_request.owner = owner_filter(caller)
        runs = await list_runs(bus, tape_request, timeout=admin_timeout(request))
        return [run_row(r) for r in runs if caller.may_access(owner=r.owner, path=r.endpoint)]

    return await caller_call(request, "tape", ask)


def _unknown(run_id: str) -> RunNotFoundError:
    """The one answer for a run that does not exist and for one the caller may not see."""
    return RunNotFoundError(f"Unknown run {run_id}")


@router.get("/api/runs/{run_id}/steps", summary="The recorded steps of one of your runs", responses=CALLER_ERRORS)
async def my_run_steps(request: Request, run_id: RunId, fromSeq: FromSeq = 0, max: MaxSteps = 500) -> Any:  # noqa: N803
    """`{runId, steps: [{seq, kind, payload, ts}], count, run, nextFromSeq?}`, as the admin's steps.

    Another user's run, or one whose agent the token's grant does not cover, is 404 exactly as
    an unknown run.
    """

    async def ask(bus: Bus, caller: Caller) -> dict[str, Any]:
        if not valid_id(run_id):
            raise MalformedRequestError("Malformed run id")
        tape_request = GetStepsRequest(run_id=run_id, from_seq=fromSeq, max=max, owner=owner_filter(caller))
        reply = await read_steps(bus, tape_request, timeout=admin_timeout(request))
        if not reply.HasField("run") or not caller.may_access(owner=reply.run.owner, path=reply.run.endpoint):
            raise _unknown(run_id)
        return steps_page(reply)

    return await caller_call(request, "tape", ask)


@router.get(
    "/api/runs/{run_id}/replay", summary="One of your runs and the runs it started, rebuilt", responses=CALLER_ERRORS
)
async def my_run_replay(request: Request, run_id: RunId) -> Any:
    """`{present: true, runCount, root, children, childrenOmitted?}`, as the admin's replay.

    An unknown run, another user's, or one whose agent the token's grant does not cover is 404
    (never `present: false`). `children` are the run's own sub-runs (the tape keeps those of its
    owner only).
    """

    async def ask(bus: Bus, caller: Caller) -> dict[str, Any]:
        if not valid_id(run_id):
            raise MalformedRequestError("Malformed run id")
        tape_request = ReplayRequest(run_id=run_id, owner=owner_filter(caller))
        reply = await read_replay(bus, tape_request, timeout=admin_timeout(request))
        # With auth the tape has already checked the owner (`present` is false otherwise).
        if not reply.present or not caller.may_use(reply.root.endpoint):
            raise _unknown(run_id)
        return replay_tree(reply)

    return await caller_call(request, "tape", ask)
