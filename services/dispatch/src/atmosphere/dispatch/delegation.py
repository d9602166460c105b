"""`delegate_task` and `task`: a coordinator's sub-runs, streamed into its own stream.

Both start a real run on the bus (`RunSubmission` with `parent_run_id`), so a sub-run gets what
every run gets — governance admission (the fleet edge), a worker, the tape — and follow its
events. Every event of the sub-run except its run-id and terminal events is forwarded into the
parent's stream tagged with the sub-run's id and agent (`origin_run_id`, `origin_agent`), so
the client sees what each sub-agent does while it does it. Only the sub-run's answer text
comes back to the model as the tool result.

`delegate_task` to a coordinator's `RemoteAgent` goes to another A2A server instead
(`remote_fleet`, `remote_delegation`): the same edge — governance admits it as it admits a sub-run (the parent
run, the member's name, its URL in the metadata) and its end is reported — and its text
forwarded tagged the same way; only declared members, by name or declared URL, are reachable.

`task` spawns the ephemeral general-purpose sub-agent: a fresh conversation, only
`write_todos` and the file tools, its own workspace (removed on every exit path), nesting
depth and spawn count bounded, a deadline.

Sizes: a sub-run's request must fit in one bus message (the tool gateway already bounds the
arguments, so only a message at the very edge can miss); a forwarded event that no longer fits
with its origin fields is left out of the parent's stream (the sub-run's own stream and the
tape keep it) with a warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from atmosphere.bus import Bus, BusError, PayloadTooLargeError
from atmosphere.bus.errors import GovernanceDeniedError, ServiceError, plain_reason
from atmosphere.bus.runs import (
    RUN_ID_METADATA_KEY,
    SERVER_SIDE_KINDS,
    cancel_run,
    follow_run,
    is_terminal,
    last_event,
    new_run,
    subagent_depth_of,
)
from atmosphere.bus.sizes import data_budget
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, RunSubmission
from atmosphere.contracts.tool.v1.tool_pb2 import WorkspaceScope
from atmosphere.dispatch.effects import current_call_key
from atmosphere.dispatch.governance_client import GovernanceClient
from atmosphere.dispatch.memory_client import MemoryClient
from atmosphere.dispatch.remote_delegation import RemoteLimits, RemoteMember
from atmosphere.dispatch.remote_fleet import RemoteFleet
from atmosphere.sdk.builtin_tools import DELEGATION_TIMEOUT

log = logging.getLogger("atmosphere.dispatch")

Emit = Callable[[RunEvent], Awaitable[None]]

SUBAGENT = "_subagent"
"""The internal agent name of `task` sub-runs (no user agent can have it: names start alphanumeric)."""
SUBAGENT_TYPE = "general-purpose"
SUBAGENT_SYSTEM_PROMPT = (
    "You are a focused worker with an isolated workspace. Finish the single task you are given, end to end. "
    "You may plan with write_todos and stage work with the file tools (ls, read_file, write_file, edit_file, "
    "glob, grep, delete, rename). You cannot ask follow-up questions: make reasonable assumptions. "
    "When you are done, reply with a concise final report of what you did and found."
)
MAX_DEPTH = 2
MAX_SPAWNS_PER_REQUEST = 8
WORKSPACE_KEY = "ai.subagent.workspace"
"""Run metadata of a sub-agent run: `{"owner": <spawn id>, "agentId": "subagent-<8>"}`."""
SUBAGENT_CATEGORY = "subagents"


def subagent_scope(run: RunSubmission) -> WorkspaceScope | None:
    """The workspace of a `task` sub-run, from its metadata; None for other runs."""
    raw = run.metadata.get(WORKSPACE_KEY)
    if run.agent != SUBAGENT or not raw:
        return None
    try:
        data = json.loads(raw)
        return WorkspaceScope(
            category=SUBAGENT_CATEGORY,
            owner=str(data["owner"]),
            agent_id=str(data["agentId"]),
            conversation_id=run.conversation_id,
        )
    except (ValueError, KeyError, TypeError):
        return None


@dataclass
class _Outcome:
    text: str
    error: RunEvent | None = None
    timed_out: bool = False


PERMISSION_MODE_KEY = "ai.permissionMode"
"""The run metadata naming a requested permission mode (read by `permissions.requested_mode`)."""


class Delegation:
    """The delegation tools of one coordinator run."""

    def __init__(
        self,
        bus: Bus,
        parent: RunSubmission,
        emit: Emit,
        *,
        fleet: Mapping[str, str],
        memory: MemoryClient,
        timeout: float = DELEGATION_TIMEOUT,
        permission_mode: str = "",
        remotes: Mapping[str, RemoteMember] | None = None,
        governance: GovernanceClient | None = None,
        remote_limits: RemoteLimits | None = None,
    ) -> None:
        """Delegate on behalf of `parent`, forwarding sub-run events through `emit`.

        `fleet` names the agents `delegate_task` may reach, each with its dispatch pool (where its
        sub-runs are queued); a `task` sub-agent runs in the parent's own pool, on its runtime.
        `remotes` are the remote A2A members it may reach too, each call admitted by `governance`
        as a sub-run's is (without it a remote call is refused: fail-closed).

        `permission_mode` (the parent's, when stricter than DEFAULT) travels to every sub-run as its
        requested mode: a sub-run may only be stricter than what it asks, so a PLAN parent's
        sub-agents ask for approval too, and a DENY_ALL parent's run no tools.
        """
        self._permission_mode = permission_mode
        self._bus = bus
        self._parent = parent
        self._emit = emit
        self._fleet = fleet
        self._memory = memory
        self._timeout = timeout
        self._spawns = 0
        self._remotes = RemoteFleet(
            remotes or {}, governance=governance, limits=remote_limits or RemoteLimits(), emit=emit
        )

    def _child(
        self,
        agent: str,
        message: str,
        *,
        conversation_id: str,
        metadata: dict[str, str],
        subagent: bool = False,
        pool: str = "",
    ) -> RunSubmission:
        # One level below the parent on the run queue, whatever kind of delegation this is.
        # In a durable parent the sub-run's id comes from the call's journal key: a resumed call
        # finds the sub-run the interrupted one started instead of starting another.
        key = current_call_key()
        if self._permission_mode:
            metadata = {**metadata, PERMISSION_MODE_KEY: self._permission_mode}
        return new_run(
            run_id=key[:32],
            agent=agent,
            message=message,
            principal=self._parent.principal,
            conversation_id=conversation_id,
            transport="delegation",
            metadata=metadata,
            parent=self._parent,
            subagent=subagent,
            pool=pool,
        )

    async def delegate_task(self, arguments: dict[str, Any]) -> str:
        """Route a subtask to a fleet member, local or remote; its reply text, or a failure text."""
        if not self._fleet and not self._remotes.names:
            return "delegate_task unavailable: no agent fleet is bound to this session."
        available = f"Available agents: [{', '.join([*self._fleet, *self._remotes.names])}]"
        agent = str(arguments.get("agent") or "").strip()
        if not agent:
            return f"delegate_task failed: 'agent' is required. {available}"
        message = str(arguments.get("message") or "")
        remote = self._remotes.find(agent)
        if remote is not None:
            child = self._child(
                remote.name,
                message,
                conversation_id=f"{self._parent.conversation_id}--{remote.name}",
                metadata=RemoteFleet.metadata(remote),
            )
            return await self._remotes.delegate(remote, child)
        if agent not in self._fleet:
            return f"delegate_task failed: unknown agent '{agent}'. {available}"
        return await self._delegate_local(agent, message)

    async def _delegate_local(self, agent: str, message: str) -> str:
        """Run the subtask as a sub-run of the fleet member `agent` on the bus."""
        child = self._child(
            agent,
            message,
            # The member keeps its own conversation with this coordinator's conversation.
            conversation_id=f"{self._parent.conversation_id}--{agent}",
            pool=self._fleet[agent],
            metadata={
                "fleet.dispatch.agent": agent,
                "fleet.dispatch.skill": "default",
            },
        )
        outcome = await self._follow(child)
        if outcome.timed_out:
            return f"delegate_task to '{agent}' failed: no reply within {self._timeout:g} seconds"
        if outcome.error is not None:
            detail = outcome.error.error.message or "no error detail"
            return f"delegate_task to '{agent}' failed: {detail}"
        return outcome.text

    def _task_refusal(self, arguments: dict[str, Any]) -> str | None:
        """Why a `task` call cannot spawn, or None."""
        if not str(arguments.get("description") or "").strip():
            return "task failed: 'description' is required."
        kind = str(arguments.get("subagent_type") or SUBAGENT_TYPE).strip().lower() or SUBAGENT_TYPE
        if kind != SUBAGENT_TYPE:
            return (
                f"task failed: unknown subagent_type '{arguments.get('subagent_type')}'. Only 'general-purpose' "
                "is supported — use delegate_task for a named fleet specialist."
            )
        if subagent_depth_of(self._parent) >= MAX_DEPTH:
            return (
                f"task refused: maximum subagent nesting depth ({MAX_DEPTH}) reached — complete this step inline "
                "instead of spawning again."
            )
        if self._spawns >= MAX_SPAWNS_PER_REQUEST:
            return f"task refused: maximum subagent spawns ({MAX_SPAWNS_PER_REQUEST}) for this request reached."
        return None

    async def task(self, arguments: dict[str, Any]) -> str:
        """Spawn the ephemeral general-purpose sub-agent; its final report, or why not."""
        refusal = self._task_refusal(arguments)
        if refusal is not None:
            return refusal
        description = str(arguments["description"]).strip()
        self._spawns += 1  # a spawn counts even when it fails
        key = current_call_key()
        spawn = key[32:] or uuid.uuid4().hex
        agent_id = f"subagent-{spawn[:8]}"
        child = self._child(
            SUBAGENT,
            description,
            conversation_id=str(uuid.UUID(key[:32])) if key else str(uuid.uuid4()),
            metadata={
                WORKSPACE_KEY: json.dumps({"owner": spawn, "agentId": agent_id}),
                "subagent.spawn": SUBAGENT_TYPE,
            },
            subagent=True,
            pool=self._parent.pool,
        )
        scope = WorkspaceScope(
            category=SUBAGENT_CATEGORY, owner=spawn, agent_id=agent_id, conversation_id=child.conversation_id
        )
        try:
            outcome = await self._follow(child)
        finally:
            # The sub-agent's plan and files go with it, whatever happened (the sub-run's own
            # worker drops them too when it ends; dropping twice is harmless).
            await asyncio.shield(self._memory.drop_workspace(scope))
        if outcome.timed_out:
            return f"task did not complete within {self._timeout:g} seconds."
        if outcome.error is not None:
            error = ServiceError.from_proto(outcome.error.error)
            if isinstance(error, GovernanceDeniedError):
                return f"task denied by policy: {error.reason or error.message}"
            return f"task failed: {error.message or 'unknown error'}"
        return outcome.text.strip() or "task completed with no output."

    async def _follow(self, child: RunSubmission) -> _Outcome:
        """Submit `child`, forward its events, and return its answer (or how it ended)."""
        text: list[str] = []
        if child.ByteSize() > data_budget(self._bus.max_payload):
            # Refused before anything is written: a submission that fails half-way would leave
            # a run-id event behind for a run that never starts.
            error = RunEvent()
            error.error.message = (
                f"the sub-run's request is {child.ByteSize()} bytes; the limit is {data_budget(self._bus.max_payload)}"
            )
            return _Outcome("", error=error)
        # A sub-run already under way (its durable parent resumed) is followed from its start,
        # not submitted again: the parent's stream holds back what it already forwarded.
        started = bool(current_call_key()) and await _exists(self._bus, child.run_id)
        events = follow_run(self._bus, child.run_id, submit=None if started else child)
        finished = False
        try:
            async with asyncio.timeout(self._timeout):
                async for event in events:
                    kind = event.WhichOneof("kind")
                    if is_terminal(event):
                        finished = True
                        return _Outcome("".join(text), error=event if kind == "error" else None)
                    if kind == "text_delta" and not event.origin_run_id:
                        text.append(event.text_delta.text)
                    if kind == "metadata" and event.metadata.key == RUN_ID_METADATA_KEY:
                        continue  # the client's run id is the parent's; the sub-run's is on every frame
                    if kind in SERVER_SIDE_KINDS:
                        continue  # the sub-run's own tape has its model input
                    await self._forward(event)
        except TimeoutError:
            return _Outcome("".join(text), timed_out=True)
        except PayloadTooLargeError as exc:  # only the submission is large enough to meet this
            error = RunEvent()
            error.error.message = f"the sub-run's request is {exc.size} bytes; the limit is {exc.limit}"
            return _Outcome("".join(text), error=error)
        except BusError as exc:
            log.warning("sub-run %s of run %s: %s", child.run_id, self._parent.run_id, exc)
            error = RunEvent()
            error.error.message = f"the sub-run could not be followed ({plain_reason(exc)})"
            return _Outcome("".join(text), error=error)
        finally:
            await events.aclose()
            if not finished:
                # Timed out, failed, or the parent was cancelled: the sub-run must not go on alone.
                with contextlib.suppress(Exception):
                    # The owner's principal goes along: the sub-run's worker takes control only from it.
                    stop = cancel_run(
                        self._bus, child.run_id, "the parent run stopped waiting", principal=child.principal
                    )
                    await asyncio.shield(stop)
        error = RunEvent()
        error.error.message = "the sub-run ended without a terminal event"
        return _Outcome("".join(text), error=error)

    async def _forward(self, event: RunEvent) -> None:
        try:
            await self._emit(self._forwarded(event))
        except PayloadTooLargeError as exc:
            log.warning(
                "run %s: event %d of sub-run %s not forwarded (%s); it stays in the sub-run's stream",
                self._parent.run_id,
                event.seq,
                event.run_id,
                exc,
            )

    @staticmethod
    def _forwarded(event: RunEvent) -> RunEvent:
        forwarded = RunEvent()
        forwarded.CopyFrom(event)
        # Nested sub-runs keep the innermost origin.
        forwarded.origin_run_id = event.origin_run_id or event.run_id
        forwarded.origin_agent = event.origin_agent or event.agent
        return forwarded


async def _exists(bus: Bus, run_id: str) -> bool:
    """Whether the run has any stored event (when it cannot be told: no, and it is submitted)."""
    try:
        return await last_event(bus, run_id) is not None
    except BusError:
        return False
