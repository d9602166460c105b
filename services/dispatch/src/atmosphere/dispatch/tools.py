"""The tool choke point: every tool call of every runtime and entry path goes through `run`.

Order, as in Atmosphere (§11.3): argument validation → governance check (fail-closed) → the
tool's required roles → `tool-start` → the run's permission mode and the configured permission
(`permissions.gate`) → approval gate → execution with the tool's deadline → governance's
injection screen of the result (fail-closed, `tool_screen`) → offload of an over-long result to
the workspace → `tool-result` or `tool-error`. The text returned is what the model sees;
refusals and failures are JSON (or `Error: ...`) texts, never exceptions. A refusal before
`tool-start` emits no frame; one after it ends with a `tool-error`.
A user tool may also ask for approval while it runs (it raises `atmosphere.sdk.ApprovalRequired`;
the sandbox's reply carries the request): the same gate is held, and an approved call is sent
again marked approved (`APPROVED_ARGUMENT`), once — or at once, without asking, when the run's
mode lets the tool run unapproved (BYPASS; ACCEPT_EDITS for an EDIT tool).

Where a call executes: user tools on `atmo.tool.<name>` (the sandbox), the harness's plan and
file tools on `atmo.mem.tool.<name>` (memory, with the run's workspace), delegation tools in
this process (they start sub-runs).

Sizes: every call travels in one bus message, bounded by the broker's limit less room for the
envelope (`atmosphere.bus.sizes.data_budget`). Arguments over it are refused before anything is
sent (an `Error: the arguments of tool X are N bytes; the limit is M` result, never a failed
send reported as "governance is unavailable"). A result too large for one message arrives
whole all the same: the sandbox stores it in the object bucket `ATMO_TOOL_RESULTS` and names it
in its reply, and it is read back here (then deleted). A result over the offload threshold is
saved to the workspace in parts that each fit; one that cannot be saved is cut, with a marker
saying so and how large it was, to what one run event can carry.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from atmosphere.bus import (
    Bus,
    BusError,
    NoRespondersError,
    PayloadTooLargeError,
    RemoteError,
    RequestTimeoutError,
    subjects,
)
from atmosphere.bus.errors import plain_reason
from atmosphere.bus.sizes import clip, data_budget, head, utf8_len
from atmosphere.contracts.run.v1.run_pb2 import (
    ApprovalRequired,
    RunEvent,
    RunSubmission,
    ToolError,
    ToolResult,
    ToolStart,
)
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolReply, WorkspaceScope
from atmosphere.dispatch import tool_errors
from atmosphere.dispatch.control import RunControl
from atmosphere.dispatch.effects import RunEffects, ToolEffect, current_effect
from atmosphere.dispatch.governance_client import GovernanceClient
from atmosphere.dispatch.permissions import (
    ToolPermissions,
    auto_approves,
    gate,
    missing_roles,
)
from atmosphere.dispatch.schema import check_arguments
from atmosphere.dispatch.tool_screen import screen_result
from atmosphere.sdk import PermissionMode
from atmosphere.sdk.builtin_tools import OFFLOAD_PREVIEW_CHARS, offload_path, offload_preview
from atmosphere.sdk.host import APPROVED_ARGUMENT
from atmosphere.sdk.runtime import ToolCallRequest, ToolSpec

log = logging.getLogger("atmosphere.dispatch")

Emit = Callable[[RunEvent], Awaitable[None]]
LocalTool = Callable[[dict[str, Any]], Awaitable[str]]
"""A tool executed inside dispatch (delegation): arguments in, text for the model out."""


OFFLOAD_PART_BYTES = 256 * 1024
"""The most UTF-8 bytes of a result saved in one workspace file (memory's per-file limit is 512 KiB)."""
MAX_OFFLOAD_PARTS = 16
"""A result is saved in at most this many files; beyond them it is cut, and the preview says so."""
_SAVE_ROOM = 1024
"""Bytes of a save request besides the part's JSON text (the path, the JSON keys)."""


def _parse_arguments(raw: str) -> dict[str, Any] | None:
    """The arguments object, or None when they are not one (bad JSON, too deep, a number too long)."""
    try:
        arguments = json.loads(raw or "{}")
    except (ValueError, RecursionError):
        return None
    return arguments if isinstance(arguments, dict) else None


def _approved_arguments(payload_json: str, arguments: dict[str, Any]) -> dict[str, Any] | None:
    """The arguments an approval lets run: as asked, or as the reviewer edited them; None when unusable."""
    if not payload_json:
        return arguments
    try:
        edited = json.loads(payload_json)
    except (ValueError, RecursionError):
        return None
    edited = edited.get("arguments", edited) if isinstance(edited, dict) else None
    return edited if isinstance(edited, dict) else None


def _approval_asked(reply: ToolReply) -> str | None:
    """The message of a tool that raised `ApprovalRequired` (its reply carries the request), or None."""
    for event in reply.events:
        if event.WhichOneof("kind") == "approval_required":
            return event.approval_required.message
    return None


def _json_len(text: str) -> int:
    return utf8_len(json.dumps(text, ensure_ascii=False))


def split_for_saving(
    content: str,
    *,
    max_json_bytes: int,
    max_part_bytes: int = OFFLOAD_PART_BYTES,
    max_parts: int | None = None,
) -> list[str]:
    """`content` in consecutive parts, each at most `max_part_bytes` of UTF-8 and `max_json_bytes` as JSON.

    With `max_parts`, at most that many parts plus one: whether more followed is all the caller
    needs to know of the rest, and a large result is not split further for nothing.
    """
    parts: list[str] = []
    position = 0
    while position < len(content) and (max_parts is None or len(parts) <= max_parts):
        piece = head(content[position : position + max_part_bytes], max_part_bytes)
        while (size := _json_len(piece)) > max_json_bytes:
            # Escapes make the JSON longer than the text: shrink in proportion, with some slack.
            piece = piece[: max(1, len(piece) * max_json_bytes // size - 16)]
        parts.append(piece)
        position += len(piece)
    return parts


def _parts_preview(content: str, paths: list[str], saved_chars: int) -> str:
    """What the model sees of a result saved in several files."""
    hidden = len(content) - OFFLOAD_PREVIEW_CHARS
    listing = ", ".join(paths)
    note = (
        f"[... {hidden} chars truncated. Full output saved in {len(paths)} parts, in order: {listing}"
        " — use read_file to read them.]"
    )
    if saved_chars < len(content):
        note += (
            f"\n[Only the first {saved_chars} of {len(content)} chars were saved: at most {MAX_OFFLOAD_PARTS}"
            " parts are kept.]"
        )
    return f"{content[:OFFLOAD_PREVIEW_CHARS]}\n\n{note}"


async def _effect_starts() -> None:
    """Journal the current call as pending, just before its side effect (durable runs)."""
    effect = current_effect()
    if effect is not None:
        await effect.start()


async def _effect_settles(*, error: bool, text: str) -> None:
    """Commit the current call's outcome, just before it is reported (durable runs)."""
    effect = current_effect()
    if effect is not None:
        await effect.settle(error=error, text=text)


TOOL_REPLY_GRACE = 2.0
"""Seconds past a tool's deadline dispatch still waits for the sandbox's own answer (its timeout error)."""


@dataclass
class ToolGateway:
    """Runs the tool calls of one run."""

    bus: Bus
    run: RunSubmission
    emit: Emit
    tools: Mapping[str, ToolSpec]
    control: RunControl
    approval_timeout: float = 300.0
    workspace: WorkspaceScope | None = None
    """The run's harness workspace (plan and file tools, offload); None without one."""
    memory_tools: frozenset[str] = frozenset()
    """Built-in tools of this agent served by memory (a user tool of the same name is not here)."""
    local_tools: Mapping[str, LocalTool] | None = None
    offload_threshold: int = 0
    """Results longer than this go to a workspace file (0: never; needs a workspace with files)."""
    offload: bool = False
    governance: GovernanceClient | None = None
    """Who checks each call (by default a client on `bus` with its default timeout)."""
    effects: RunEffects | None = None
    """A durable run's journal handles: committed calls and approvals replay instead of running."""
    permission_mode: PermissionMode = PermissionMode.DEFAULT
    """The run's mode: its agent's, or the stricter one its request asked for (`permissions.run_mode`)."""
    permissions: ToolPermissions = field(default_factory=ToolPermissions)
    """The operator's `deny`/`confirm` per tool name or glob."""
    tool_roles: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """The roles the caller must all hold, by tool (tools not here: anyone may call them)."""

    sessions: dict[str, str] = field(default_factory=dict)
    """The sandbox instance holding this run's session of a tool, by tool (`ToolReply.session_instance`)."""

    def __post_init__(self) -> None:
        """Ask governance over the run's bus unless the run brought its client."""
        if self.governance is None:
            self.governance = GovernanceClient(self.bus)

    async def release_sessions(self) -> None:
        """Tell each sandbox holding a session of this run that the run ended (at most once; never fails).

        A release that does not arrive is not lost work: the sandbox reaps idle sessions after
        `ATMOSPHERE_AI_CODE_SANDBOXTTLSECONDS`.
        """
        sessions, self.sessions = self.sessions, {}
        for tool, instance in sessions.items():
            release = ToolCall(name=tool, run_id=self.run.run_id, call_id=uuid.uuid4().hex)
            try:
                await self.bus.publish(subjects.sandbox_release(instance), release)
            except (BusError, ValueError) as exc:
                log.debug("run %s: the release of its %s session was not sent (%s)", self.run.run_id, tool, exc)

    @property
    def data_limit(self) -> int:
        """The most bytes of arguments or of a result one call carries."""
        return data_budget(self.bus.max_payload)

    async def run_tool(self, call: ToolCallRequest) -> str:
        """Run one call; the returned text goes back to the model."""
        spec = self.tools.get(call.name)
        if spec is None:
            return tool_errors.unknown_tool(call.name)
        checked = await self._checked_arguments(call, spec)
        if isinstance(checked, str):
            return checked
        arguments, encoded = checked
        start = RunEvent(tool_start=ToolStart(tool_name=call.name, call_id=call.call_id, arguments_json=encoded))
        effect = self.effects.tool_call(call.name, arguments) if self.effects is not None else None
        if effect is not None:
            replayed = await self._replayed(call, spec, effect, start)
            if replayed is not None:
                return replayed
        refusal = await self._admitted(call)
        if refusal is not None:
            return refusal
        await self.emit(start)
        token = effect.enter() if effect is not None else None
        try:
            return await self._gated(call, spec, arguments)
        finally:
            if token is not None:
                ToolEffect.leave(token)

    async def _admitted(self, call: ToolCallRequest) -> str | None:
        """The refusal of governance or of the tool's roles, before `tool-start` (no frames); None: go on."""
        refusal = await self._govern(call)
        if refusal is None and not self._authorized(call):
            refusal = tool_errors.INSUFFICIENT_AUTHORIZATION
        return refusal

    async def _gated(self, call: ToolCallRequest, spec: ToolSpec, arguments: dict[str, Any]) -> str:
        """After `tool-start`: the permission mode and configured permission, the approval gate, execution."""
        verdict = gate(self.permission_mode, self.permissions.of(call.name), spec)
        if verdict.refusal is not None:
            log.info("run %s: %s refused: %s", self.run.run_id, call.name, verdict.refusal)
            return await self._fail(call, verdict.refusal)
        if verdict.needs_approval:
            outcome = await self._approved(call, arguments)
            if isinstance(outcome, str):
                return outcome
            arguments = self._marked_approved(call, outcome)
        return await self._execute(call, spec, arguments)

    def _authorized(self, call: ToolCallRequest) -> bool:
        """Whether the run's principal holds every role the tool requires (server-set roles, never metadata)."""
        missing = missing_roles(self.tool_roles.get(call.name, ()), self.run.principal.roles)
        if missing:
            log.info("run %s: %s refused: the caller lacks the role(s) %s", self.run.run_id, call.name, missing)
        return not missing

    async def _replayed(self, call: ToolCallRequest, spec: ToolSpec, effect: ToolEffect, start: RunEvent) -> str | None:
        """A journaled call's outcome without running it (or any gate again), or None: run it.

        Committed: its frames again (a client that has them gets nothing new) and its text. Started
        by a worker that died before it reported: run again only if the tool is idempotent, else
        reported to the model as interrupted — it may have taken effect, and is never silently
        repeated.
        """
        outcome = effect.replay
        if outcome is None and not (effect.interrupted and not spec.idempotent):
            return None
        await self.emit(start)
        if outcome is None:
            text = tool_errors.INTERRUPTED.format(name=call.name)
            effect.started = True
            await effect.settle(error=True, text=text)
            log.warning("run %s: %s was interrupted with its worker; reported, not re-run", self.run.run_id, call.name)
            outcome = (True, text)
        is_error, text = outcome
        if is_error:
            await self.emit(RunEvent(tool_error=ToolError(tool_name=call.name, call_id=call.call_id, error=text)))
        else:
            await self.emit(RunEvent(tool_result=ToolResult(tool_name=call.name, call_id=call.call_id, result=text)))
        return text

    async def _checked_arguments(self, call: ToolCallRequest, spec: ToolSpec) -> tuple[dict[str, Any], str] | str:
        """The arguments and their JSON text, or the refusal the model gets instead."""
        # Measured before parsing: a 10 MB argument is refused without being parsed or sent.
        oversized = self._oversized(call, utf8_len(call.arguments_json))
        if oversized is not None:
            return await self._fail(call, oversized)
        arguments = _parse_arguments(call.arguments_json)
        if arguments is None:
            return tool_errors.invalid_arguments(call.name, [tool_errors.NOT_AN_OBJECT])
        # The harness's plan and file tools check their own arguments, leniently (a model's
        # double-encoded `todos` is accepted) and with Atmosphere's exact error texts.
        problems = [] if call.name in self.memory_tools else check_arguments(spec.parameters, arguments)
        if problems:
            return tool_errors.invalid_arguments(call.name, problems)
        encoded = json.dumps(arguments)
        oversized = self._oversized(call, utf8_len(encoded))  # escapes can make the re-encoding longer
        if oversized is not None:
            return await self._fail(call, oversized)
        return arguments, encoded

    async def _approved(
        self, call: ToolCallRequest, arguments: dict[str, Any], *, message: str = ""
    ) -> dict[str, Any] | str:
        """The arguments as approved (possibly edited), or the text the model gets instead.

        Whatever ends the call here ends it with a frame after its `tool-start`, as an executed
        call would: `tool-result` for a reviewer's `respond`, `tool-error` for a denial, a
        timeout or unusable edited arguments.
        """
        outcome = await self._approve(call, arguments, message=message)
        if isinstance(outcome, str):
            return outcome
        oversized = self._oversized(call, utf8_len(json.dumps(outcome)), approved=True)
        if oversized is not None:
            return await self._fail(call, oversized)
        return outcome

    def _oversized(self, call: ToolCallRequest, size: int, *, approved: bool = False) -> str | None:
        """The refusal of arguments too large for one bus message, or None when they fit."""
        if size <= self.data_limit:
            return None
        log.warning("run %s: the arguments of %s are %d bytes; refused", self.run.run_id, call.name, size)
        return tool_errors.oversized_arguments(call.name, size, self.data_limit, approved=approved)

    async def _govern(self, call: ToolCallRequest) -> str | None:
        assert self.governance is not None
        try:
            decision = await self.governance.check_tool(self.run, call.name, call.arguments_json)
        except PayloadTooLargeError as exc:
            return await self._fail(call, tool_errors.governance_check_too_large(call.name, exc))
        except RemoteError as exc:
            log.warning("run %s: governance refused to check %s (%s)", self.run.run_id, call.name, exc)
            return await self._fail(call, tool_errors.governance_could_not_check(call.name, exc))
        except BusError as exc:
            log.warning("run %s: governance did not answer for %s (%s); refusing", self.run.run_id, call.name, exc)
            return await self._fail(call, tool_errors.governance_unavailable(call.name))
        if not decision.allowed:
            return tool_errors.denied_by_policy(call.name, decision.policy, decision.reason)
        return None

    async def _approve(
        self, call: ToolCallRequest, arguments: dict[str, Any], *, message: str = ""
    ) -> dict[str, Any] | str:
        approval = self.effects.approval(call.name, arguments) if self.effects is not None else None
        if approval is not None:
            decided = approval.decided
            if decided is not None:  # decided before the worker died: not asked again
                return await self._decided(call, arguments, str(decided["action"]), str(decided["payload"]))
            await approval.ask()
        # A durable run asks again under the same id, so an answer to the first asking still counts.
        approval_id = "apr_" + (approval.key[:12] if approval is not None else secrets.token_hex(6))
        decision_future = self.control.expect_approval(approval_id)
        await self.emit(
            RunEvent(
                approval_required=ApprovalRequired(
                    approval_id=approval_id,
                    call_id=call.call_id,
                    tool_name=call.name,
                    arguments_json=json.dumps(arguments),
                    message=message or f"Allow {call.name} to run with these arguments?",
                    expires_in_seconds=int(self.approval_timeout),
                )
            )
        )
        try:
            decision = await asyncio.wait_for(decision_future, self.approval_timeout)
        except TimeoutError:
            if approval is not None:
                await approval.expire()
            return await self._fail(call, tool_errors.APPROVAL_TIMED_OUT)
        if approval is not None:
            await approval.decide(decision.action, decision.payload_json)
        return await self._decided(call, arguments, decision.action, decision.payload_json)

    async def _decided(
        self, call: ToolCallRequest, arguments: dict[str, Any], action: str, payload_json: str
    ) -> dict[str, Any] | str:
        """What a reviewer's decision makes of the call: arguments to run it with, or its outcome text."""
        if action in {"approve", "yes"}:
            edited = _approved_arguments(payload_json, arguments)
            return edited if edited is not None else await self._fail(call, tool_errors.CANCELLED_BY_USER)
        if action == "respond" and payload_json:
            # The reviewer's answer stands in for the tool's: the model and the client get it as the
            # result. It is the run owner's own text, not a tool's output: not screened.
            return await self._succeed(call, payload_json, screen=False)
        return await self._fail(call, tool_errors.CANCELLED_BY_USER)

    async def _execute(self, call: ToolCallRequest, spec: ToolSpec, arguments: dict[str, Any]) -> str:
        local = (self.local_tools or {}).get(call.name)
        if local is not None:
            return await self._run_local(call, spec, local, arguments)
        request = ToolCall(
            call_id=call.call_id or uuid.uuid4().hex,
            name=call.name,
            arguments_json=json.dumps(arguments),
            run_id=self.run.run_id,
            conversation_id=self.run.conversation_id,
            agent=self.run.agent,
            principal=self.run.principal,
        )
        subject = subjects.tool(call.name)
        if call.name in self.memory_tools:
            subject = subjects.memory_tool(call.name)
            if self.workspace is not None:
                request.workspace.CopyFrom(self.workspace)
        await _effect_starts()
        try:
            reply = await self._delivered(call, spec, subject, request)
        except BusError as exc:
            failure = tool_errors.delivery_failure(
                call.name, spec.timeout, exc, memory_tool=call.name in self.memory_tools
            )
            return await self._fail(call, failure)
        if reply.session_instance:
            self.sessions[call.name] = reply.session_instance
        asked = _approval_asked(reply)
        if asked is not None:
            return await self._rerun_approved(call, spec, arguments, asked)
        for side_event in reply.events:  # e.g. the plan-update of write_todos, before the result
            await self.emit(side_event)
        if reply.is_error:
            return await self._fail(call, reply.content)
        if reply.result_object:
            return await self._succeed_stored(call, reply.result_object)
        return await self._succeed(call, reply.content)

    async def _delivered(self, call: ToolCallRequest, spec: ToolSpec, subject: str, request: ToolCall) -> ToolReply:
        """The tool's reply, from the sandbox holding the run's session of it if one does.

        The wait is the tool's deadline plus `TOOL_REPLY_GRACE`: the sandbox enforces the deadline
        itself and answers with its own error, so no reply by then means the sandbox that took the
        call is gone (killed, partitioned). An idempotent tool is then called once more, on whichever
        replica takes it; any other tool's call is an error for the model, never a hung run.
        """
        timeout = spec.timeout + TOOL_REPLY_GRACE
        instance = self.sessions.get(call.name)
        if instance is not None:
            try:
                return await self.bus.request(
                    subjects.sandbox_session_tool(instance, call.name), request, ToolReply, timeout=timeout
                )
            except NoRespondersError:
                log.warning(
                    "run %s: the sandbox holding its %s session is gone; starting anew", self.run.run_id, call.name
                )
                del self.sessions[call.name]
        try:
            return await self.bus.request(subject, request, ToolReply, timeout=timeout)
        except RequestTimeoutError:
            if not spec.idempotent:
                raise
            log.warning("run %s: no reply to idempotent %s; calling it once more", self.run.run_id, call.name)
            return await self.bus.request(subject, request, ToolReply, timeout=timeout)

    async def _succeed_stored(self, call: ToolCallRequest, name: str) -> str:
        """End the call with a result the sandbox stored as an object (`_stored_result`)."""
        try:
            content = await self._stored_result(name)
        except BusError as exc:
            log.warning("run %s: the stored result of %s could not be read (%s)", self.run.run_id, call.name, exc)
            return await self._fail(call, tool_errors.stored_result_unreadable(call.name, exc))
        return await self._succeed(call, content)

    def _marked_approved(self, call: ToolCallRequest, arguments: dict[str, Any]) -> dict[str, Any]:
        """`arguments` telling a sandbox tool that the user approved the call (`tool_call_approved()`)."""
        if call.name in self.memory_tools or call.name in (self.local_tools or {}):
            return arguments  # only the SDK's `Tool.invoke` reads the mark
        return {**arguments, APPROVED_ARGUMENT: True}

    async def _rerun_approved(
        self, call: ToolCallRequest, spec: ToolSpec, arguments: dict[str, Any], message: str
    ) -> str:
        """The tool raised `ApprovalRequired`: ask the user, then call it again marked approved (once)."""
        if arguments.get(APPROVED_ARGUMENT) is True:
            return await self._fail(call, tool_errors.approval_asked_again(call.name))
        if auto_approves(self.permission_mode, spec):
            return await self._execute(call, spec, self._marked_approved(call, arguments))
        outcome = await self._approved(call, arguments, message=message)
        if isinstance(outcome, str):
            return outcome
        return await self._execute(call, spec, self._marked_approved(call, outcome))

    async def _stored_result(self, name: str) -> str:
        """A result the sandbox stored as an object because one message could not carry it.

        Read once, then deleted: nobody else needs it (the bucket's max age clears what a crash
        between the two leaves behind).
        """
        try:
            data = await self.bus.object_get(subjects.TOOL_RESULTS_BUCKET, name)
        finally:
            try:
                await self.bus.object_delete(subjects.TOOL_RESULTS_BUCKET, name)
            except BusError as exc:
                log.debug("run %s: the stored result %s was not deleted (%s)", self.run.run_id, name, exc)
        if data is None:
            msg = "it is no longer stored"
            raise BusError(msg)
        return data.decode("utf-8", errors="replace")

    async def _run_local(
        self, call: ToolCallRequest, spec: ToolSpec, local: LocalTool, arguments: dict[str, Any]
    ) -> str:
        await _effect_starts()
        try:
            content = await asyncio.wait_for(local(arguments), spec.timeout)
        except TimeoutError:
            return await self._fail(call, tool_errors.local_timed_out(call.name, spec.timeout))
        except Exception as exc:
            log.exception("run %s: %s failed", self.run.run_id, call.name)
            why = plain_reason(exc) if isinstance(exc, BusError) else type(exc).__name__
            return await self._fail(call, tool_errors.local_failed(call.name, why))
        return await self._succeed(call, content)

    async def _succeed(self, call: ToolCallRequest, content: str, *, screen: bool = True) -> str:
        """End the call with `content`: screened (`screen`), offloaded if long, committed, reported."""
        if screen and content:
            assert self.governance is not None
            screened = await screen_result(self.governance, self.run, call.name, content, max_bytes=self.data_limit)
            if screened.error is not None:
                return await self._fail(call, screened.error)
            content = screened.text
        content = await self._maybe_offload(call, content)
        # The model and the client get the same text, and it must fit in one run event.
        content = clip(content, self.data_limit, f"the result of {call.name}")
        await _effect_settles(error=False, text=content)
        await self.emit(RunEvent(tool_result=ToolResult(tool_name=call.name, call_id=call.call_id, result=content)))
        return content

    async def _maybe_offload(self, call: ToolCallRequest, content: str) -> str:
        """An over-long result goes to the workspace; the model gets a preview and the path(s).

        A result too large for one save request or one file is saved in parts, in order. With
        no workspace, a disabled threshold, or any failure to save, the result stays inline
        (and is then cut to what one run event carries, with a marker).
        """
        if not self.offload or self.workspace is None or self.offload_threshold <= 0:
            return content
        if len(content) <= self.offload_threshold:
            return content
        parts = split_for_saving(content, max_json_bytes=self.data_limit - _SAVE_ROOM, max_parts=MAX_OFFLOAD_PARTS)
        path = offload_path(call.name)
        if len(parts) == 1:
            return offload_preview(content, path) if await self._save(call, path, content) else content
        kept = parts[:MAX_OFFLOAD_PARTS]
        paths = [f"{path.removesuffix('.txt')}.part{index}.txt" for index in range(1, len(kept) + 1)]
        for part_path, part in zip(paths, kept, strict=True):
            if not await self._save(call, part_path, part):
                return content
        return _parts_preview(content, paths, sum(len(part) for part in kept))

    async def _save(self, call: ToolCallRequest, path: str, content: str) -> bool:
        """Write one offload file through memory's `write_file`; whether it was stored."""
        try:
            save = ToolCall(
                call_id=uuid.uuid4().hex,
                name="write_file",
                # Not ASCII-escaped: a non-Latin result would be up to six times longer on the wire.
                arguments_json=json.dumps({"path": path, "content": content}, ensure_ascii=False),
                run_id=self.run.run_id,
                conversation_id=self.run.conversation_id,
                agent=self.run.agent,
                principal=self.run.principal,
                workspace=self.workspace,
            )
        except ValueError:  # a lone surrogate cannot travel unescaped; the result stays inline
            return False
        try:
            reply = await self.bus.request(subjects.memory_tool("write_file"), save, ToolReply, timeout=10.0)
        except BusError as exc:
            log.debug("run %s: offload of %s failed (%s); inline", self.run.run_id, call.name, exc)
            return False
        if reply.is_error:
            log.debug("run %s: offload of %s refused (%s); inline", self.run.run_id, call.name, reply.content)
            return False
        return True

    async def _fail(self, call: ToolCallRequest, message: str) -> str:
        message = clip(message, self.data_limit, f"the error of {call.name}")
        await _effect_settles(error=True, text=message)
        await self.emit(RunEvent(tool_error=ToolError(tool_name=call.name, call_id=call.call_id, error=message)))
        return message
