"""Who may use a stored run: its owner, through a grant that covers its agent.

Every event of a run carries its owner and its agent, so the last one stored is enough to
decide. A run the caller may not use is answered exactly like one that does not exist (404),
so run ids cannot be probed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Path, Request

from atmosphere.bus import BusError
from atmosphere.bus.runs import last_event
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.ingress.auth import Caller
from atmosphere.ingress.errors import RunNotFoundError, UnavailableError
from atmosphere.ingress.http import identified_caller
from atmosphere.ingress.state import IngressState

RUN_ID_PATTERN = r"^[A-Za-z0-9_\-:@]{1,128}$"
RunId = Annotated[str, Path(json_schema_extra={"pattern": RUN_ID_PATTERN})]
"""A run id; anything not matching the pattern is answered with 400 (never used in a subject)."""


@dataclass(frozen=True, slots=True)
class StoredRun:
    """What a run's last stored event says about it: who owns it and which agent runs it."""

    owner: str
    agent: AgentDescriptor


async def stored_run(state: IngressState, run_id: str) -> StoredRun | None:
    """The owner and agent of a stored run (None for an unknown run, or an agent no longer served).

    Every event carries the owner, so the last one stored is enough.
    """
    last = await last_event(state.bus, run_id)
    if last is None:
        return None
    descriptor = await state.directory.lookup(last.agent)
    return None if descriptor is None else StoredRun(owner=last.owner, agent=descriptor)


async def authorize_run(state: IngressState, request: Request, run_id: str) -> Principal:
    """The caller's principal when it may read, cancel or answer this stored run, else a typed refusal.

    Authentication comes first, so a 401 says nothing about the run. A run the caller does not
    own, or whose agent its grant does not cover, is answered exactly like one that does not
    exist (404), so run ids cannot be probed. No-auth mode: every caller may use every run.
    """
    caller = identified_caller(state, request)
    await check_access(state, caller, run_id)
    return caller.principal


async def check_access(state: IngressState, caller: Caller, run_id: str) -> None:
    """Pass when `caller` may use the stored run `run_id` (see `authorize_run`), else a typed refusal."""
    try:
        stored = await stored_run(state, run_id)
    except BusError:
        raise UnavailableError("Runs cannot be looked up right now; try again") from None
    if stored is None or not caller.may_access(owner=stored.owner, path=stored.agent.path):
        raise RunNotFoundError(f"Unknown run {run_id}")
