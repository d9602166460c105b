"""The tool choke point: every tool call of every runtime and entry path goes through `run_tool`.

Each call passes a pipeline of stages, in Atmosphere's order (§11.3):

1. validate (`tool_arguments`): the tool exists; its arguments parse, fit its schema and one
   bus message;
2. govern: governance's check (fail-closed), then the tool's required roles — then `tool-start`;
3. approve: the run's permission mode and the configured permission (`permissions.gate`), then
   a human's decision when one is needed (`tool_approval`);
4. execute: in this process (delegation), or through the `SandboxPort` (user tools on the
   sandbox, the harness's plan and file tools on memory), within the tool's deadline;
5. screen (`tool_screen`): governance's injection screen of the result (fail-closed);
6. offload (`tool_offload`): an over-long result to the run's workspace;
7. record: the outcome journaled (a durable run's), then `tool-result` or `tool-error`.

A stage that ends the call raises a `tool_stops` error carrying the model's text (`tool_errors`
holds every such text): `CallRefused` before `tool-start` emits no frame, `CallFailed` ends
with a `tool-error`, `CallAnswered` (a reviewer's `respond`) with a `tool-result`. The text
returned is what the model sees; refusals and failures never reach the runtime as exceptions.

A user tool may also ask for approval while it runs (it raises `atmosphere.sdk.ApprovalRequired`;
the sandbox's reply carries the request): the same gate is held, and an approved call is sent
again marked approved (`APPROVED_ARGUMENT`), once — or at once, without asking, when the run's
mode lets the tool run unapproved (BYPASS; ACCEPT_EDITS for an EDIT tool).

A durable run's journal handles (`effects`) are passed along the call: a committed call replays
instead of running (no gate asked again), its start is marked just before its side effect, its
outcome committed just before it is reported. A result too large for one bus message arrives
whole all the same: the sandbox stores it as an object and names it in its reply
(`SandboxPort.stored_result`); what reaches the model and the client is cut, with a marker, to
what one run event can carry.

An MCP server's tool (the agent declares the server; a sandbox holds its session) is one more tool
here, with two names: the model calls it `<server>__<tool>`, and governance's check, the
operator's permissions and the logs see it as `<server>.<tool>` (`mcp_tools`), so a policy
denying `call_tool:docs.delete_page` refuses it; its call goes to `atmo.tool.mcp:<server>`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from atmosphere.bus import Bus, BusError, PayloadTooLargeError, RemoteError, subjects
from atmosphere.bus.errors import plain_reason
from atmosphere.bus.sizes import clip, data_budget
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, RunSubmission, ToolError, ToolResult, ToolStart
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolReply, WorkspaceScope
from atmosphere.dispatch import tool_errors
from atmosphere.dispatch.control import RunControl
from atmosphere.dispatch.effects import UNJOURNALED, CallEffect, RunEffects, ToolEffect
from atmosphere.dispatch.governance_client import GovernanceClient
from atmosphere.dispatch.permissions import ToolPermissions, auto_approves, gate, missing_roles
from atmosphere.dispatch.sandbox_port import BusSandbox, SandboxPort
from atmosphere.dispatch.tool_approval import Approvals
from atmosphere.dispatch.tool_arguments import checked_arguments
from atmosphere.dispatch.tool_offload import Offload
from atmosphere.dispatch.tool_screen import screen_result
from atmosphere.dispatch.tool_stops import CallAnswered, CallFailed, CallRefused
from atmosphere.sdk import PermissionMode
from atmosphere.sdk.host import APPROVED_ARGUMENT, mcp_server_of
from atmosphere.sdk.runtime import ToolCallRequest, ToolSpec

log = logging.getLogger("atmosphere.dispatch")

Emit = Callable[[RunEvent], Awaitable[None]]
LocalTool = Callable[[dict[str, Any]], Awaitable[str]]
"""A tool executed inside dispatch (delegation): arguments in, text for the model out."""


def _hosted_tool(call: ToolCallRequest) -> LocalTool | None:
    """A hosted framework object's own tool (`ToolCallRequest.local`), run here once every gate passed."""
    native = call.local
    if native is None:
        return None

    async def run(arguments: dict[str, Any]) -> str:
        # The arguments as approved (an approver may have edited them), not as the model sent them.
        return await native(json.dumps(arguments))

    return run


def _approval_asked(reply: ToolReply) -> str | None:
    """The message of a tool that raised `ApprovalRequired` (its reply carries the request), or None."""
    for event in reply.events:
        if event.WhichOneof("kind") == "approval_required":
            return event.approval_required.message
    return None


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """How one call ended: the text the model gets, and whether it is a failure or refusal (no result)."""

    text: str
    is_error: bool


@dataclass
class ToolGateway:
    """Runs the tool calls of one run, each through the choke point's stages."""

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
    sandbox: SandboxPort | None = None
    """Where calls that do not run in this process go (by default the sandbox and memory on `bus`)."""
    client_tools: Mapping[str, ToolSpec] = field(default_factory=dict)
    """The caller's own functions (an OpenAI door's `tools`): checked here, run by the caller (`pass_to_client`)."""
    mcp_tools: Mapping[str, str] = field(default_factory=dict)
    """The MCP servers' tools among `tools`: model-facing name (`docs__search`) → the name governance,
    permissions and logs see (`docs.search`). Each call goes to its server's sandbox subject."""

    def __post_init__(self) -> None:
        """The stages' collaborators: governance over the run's bus and the sandbox on it, unless given."""
        self.data_limit = data_budget(self.bus.max_payload)
        """The most bytes of arguments or of a result one call carries."""
        self._governance = self.governance or GovernanceClient(self.bus)
        self._sandbox = self.sandbox or BusSandbox(self.bus, self.run.run_id)
        self._approvals = Approvals(
            self.run.run_id, self.control, self.emit, self.approval_timeout, self.effects, self.data_limit
        )
        self._offload = Offload(
            self.bus, self.run, self.workspace, self.offload_threshold, self.offload, self.data_limit
        )

    async def release_sessions(self) -> None:
        """The run ended: each sandbox holding a session of it may let it go (`SandboxPort`)."""
        await self._sandbox.release_sessions()

    async def run_tool(self, call: ToolCallRequest) -> str:
        """Run one call through the stages; the returned text goes back to the model."""
        return (await self.run_call(call)).text

    async def run_call(self, call: ToolCallRequest) -> ToolOutcome:
        """Run one call through the stages: its text, and whether it ended without a result.

        What a run of one tool call and no model needs (`direct_call`): its result, or its error.
        """
        spec = self.tools.get(call.name)
        if spec is None:
            return ToolOutcome(tool_errors.unknown_tool(call.name), is_error=True)
        try:
            lenient = call.name in self.memory_tools
            arguments, encoded = checked_arguments(self.run.run_id, call, spec, limit=self.data_limit, lenient=lenient)
            start = RunEvent(tool_start=ToolStart(tool_name=call.name, call_id=call.call_id, arguments_json=encoded))
            effect = self.effects.tool_call(call.name, arguments) if self.effects is not None else UNJOURNALED
            replayed = await self._replayed(call, spec, effect, start)
            if replayed is not None:
                return replayed
            await self._govern(call)
        except CallRefused as refused:
            return ToolOutcome(refused.text, is_error=True)
        except CallFailed as failed:
            # Nothing started: nothing to commit.
            return ToolOutcome(await self._failed(call, failed.text, UNJOURNALED), is_error=True)
        await self.emit(start)
        return await self._started(call, spec, arguments, effect)

    async def pass_to_client(self, call: ToolCallRequest) -> str | None:
        """Check a call of the caller's own function: None when it may be handed back, else the model's text.

        It passes what any call passes before it would run — its arguments against the caller's
        schema, governance (`call_tool:<name>`), the caller's roles, the run's permission mode and
        the operator's `deny` — and is then recorded (`tool-start`) and handed back rather than
        run: the caller runs it. No approval is asked (nothing runs here; the caller decides), and
        nothing is journaled (a resumed run checks it again, which has no effect).
        """
        spec = self.client_tools.get(call.name)
        if spec is None:
            return tool_errors.unknown_tool(call.name)
        try:
            _, encoded = checked_arguments(self.run.run_id, call, spec, limit=self.data_limit, lenient=False)
            await self._govern(call)
            refusal = gate(self.permission_mode, self.permissions.of(call.name), spec).refusal
            if refusal is not None:
                log.info("run %s: %s refused: %s", self.run.run_id, call.name, refusal)
                raise CallFailed(refusal)
        except CallRefused as refused:
            return refused.text
        except CallFailed as failed:
            return await self._failed(call, failed.text, UNJOURNALED)
        start = ToolStart(tool_name=call.name, call_id=call.call_id, arguments_json=encoded)
        await self.emit(RunEvent(tool_start=start))
        return None

    async def _started(
        self, call: ToolCallRequest, spec: ToolSpec, arguments: dict[str, Any], effect: CallEffect
    ) -> ToolOutcome:
        """After `tool-start`: approve, execute, screen, offload, record."""
        try:
            arguments = await self._approve(call, spec, arguments)
            content = await self._screen(call, await self._execute(call, spec, arguments, effect))
        except CallAnswered as answered:
            content = answered.text
        except CallFailed as failed:
            return ToolOutcome(await self._failed(call, failed.text, effect), is_error=True)
        return ToolOutcome(await self._succeeded(call, await self._offload(call.name, content), effect), is_error=False)

    async def _replayed(
        self, call: ToolCallRequest, spec: ToolSpec, effect: CallEffect, start: RunEvent
    ) -> ToolOutcome | None:
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
            await effect.settle_interrupted(text)
            log.warning("run %s: %s was interrupted with its worker; reported, not re-run", self.run.run_id, call.name)
            outcome = (True, text)
        is_error, text = outcome
        if is_error:
            await self.emit(RunEvent(tool_error=ToolError(tool_name=call.name, call_id=call.call_id, error=text)))
        else:
            await self.emit(RunEvent(tool_result=ToolResult(tool_name=call.name, call_id=call.call_id, result=text)))
        return ToolOutcome(text, is_error=is_error)

    def _governed(self, name: str) -> str:
        """The name policies and permissions know the tool by: `<server>.<tool>` for an MCP tool, else `name`."""
        return self.mcp_tools.get(name, name)

    async def _govern(self, call: ToolCallRequest) -> None:
        """Governance's check (fail-closed), then the tool's required roles (server-set, never metadata)."""
        try:
            decision = await self._governance.check_tool(self.run, self._governed(call.name), call.arguments_json)
        except PayloadTooLargeError as exc:
            raise CallFailed(tool_errors.governance_check_too_large(call.name, exc)) from None
        except RemoteError as exc:
            log.warning("run %s: governance refused to check %s (%s)", self.run.run_id, call.name, exc)
            raise CallFailed(tool_errors.governance_could_not_check(call.name, exc)) from None
        except BusError as exc:
            log.warning("run %s: governance did not answer for %s (%s); refusing", self.run.run_id, call.name, exc)
            raise CallFailed(tool_errors.governance_unavailable(call.name)) from None
        if not decision.allowed:
            raise CallRefused(tool_errors.denied_by_policy(call.name, decision.policy, decision.reason))
        missing = missing_roles(self.tool_roles.get(call.name, ()), self.run.principal.roles)
        if missing:
            log.info("run %s: %s refused: the caller lacks the role(s) %s", self.run.run_id, call.name, missing)
            raise CallRefused(tool_errors.INSUFFICIENT_AUTHORIZATION)

    async def _approve(self, call: ToolCallRequest, spec: ToolSpec, arguments: dict[str, Any]) -> dict[str, Any]:
        """The permission mode and configured permission, then the approval gate: the arguments to run."""
        verdict = gate(self.permission_mode, self.permissions.of(self._governed(call.name)), spec)
        if verdict.refusal is not None:
            log.info("run %s: %s refused: %s", self.run.run_id, call.name, verdict.refusal)
            raise CallFailed(verdict.refusal)
        if not verdict.needs_approval:
            return arguments
        return self._marked_approved(call, await self._approvals.approved(call, arguments))

    async def _execute(
        self, call: ToolCallRequest, spec: ToolSpec, arguments: dict[str, Any], effect: CallEffect
    ) -> str:
        """The tool's result text: run here (delegation, a hosted object's own tool) or through the sandbox port."""
        local = (self.local_tools or {}).get(call.name) or _hosted_tool(call)
        if local is not None:
            return await self._run_local(call, spec, local, arguments, effect)
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
        if call.name in self.mcp_tools:
            subject = subjects.mcp_tool(mcp_server_of(call.name))
        elif call.name in self.memory_tools:
            subject = subjects.memory_tool(call.name)
            if self.workspace is not None:
                request.workspace.CopyFrom(self.workspace)
        await effect.start()  # just before the side effect
        try:
            reply = await self._sandbox.call(subject, request, spec)
        except BusError as exc:
            memory_tool = call.name in self.memory_tools
            server = mcp_server_of(call.name) if call.name in self.mcp_tools else ""
            failure = tool_errors.delivery_failure(
                call.name, spec.timeout, exc, memory_tool=memory_tool, mcp_server=server
            )
            raise CallFailed(failure) from None
        asked = _approval_asked(reply)
        if asked is not None:
            return await self._rerun_approved(call, spec, arguments, asked, effect)
        for side_event in reply.events:  # e.g. the plan-update of write_todos, before the result
            await self.emit(side_event)
        if reply.is_error:
            raise CallFailed(reply.content)
        if not reply.result_object:
            return reply.content
        try:
            return await self._sandbox.stored_result(reply.result_object)
        except BusError as exc:
            log.warning("run %s: the stored result of %s could not be read (%s)", self.run.run_id, call.name, exc)
            raise CallFailed(tool_errors.stored_result_unreadable(call.name, exc)) from None

    def _marked_approved(self, call: ToolCallRequest, arguments: dict[str, Any]) -> dict[str, Any]:
        """`arguments` telling a sandbox tool that the user approved the call (`tool_call_approved()`)."""
        if call.name in self.memory_tools or call.name in (self.local_tools or {}) or call.local is not None:
            return arguments  # only the SDK's `Tool.invoke` reads the mark (a framework's tool would refuse it)
        if call.name in self.mcp_tools:
            return arguments  # an MCP server knows nothing of the mark (and may refuse unknown arguments)
        return {**arguments, APPROVED_ARGUMENT: True}

    async def _rerun_approved(
        self, call: ToolCallRequest, spec: ToolSpec, arguments: dict[str, Any], message: str, effect: CallEffect
    ) -> str:
        """The tool raised `ApprovalRequired`: ask the user, then call it again marked approved (once)."""
        if arguments.get(APPROVED_ARGUMENT) is True:
            raise CallFailed(tool_errors.approval_asked_again(call.name))
        if not auto_approves(self.permission_mode, spec):
            arguments = await self._approvals.approved(call, arguments, message=message)
        return await self._execute(call, spec, self._marked_approved(call, arguments), effect)

    async def _run_local(
        self,
        call: ToolCallRequest,
        spec: ToolSpec,
        local: LocalTool,
        arguments: dict[str, Any],
        effect: CallEffect,
    ) -> str:
        """A tool run in this process; it may read its call's journal key (`effects.current_call_key`)."""
        await effect.start()
        token = effect.enter()
        try:
            return await asyncio.wait_for(local(arguments), spec.timeout)
        except TimeoutError:
            raise CallFailed(tool_errors.local_timed_out(call.name, spec.timeout)) from None
        except Exception as exc:
            log.exception("run %s: %s failed", self.run.run_id, call.name)
            why = plain_reason(exc) if isinstance(exc, BusError) else type(exc).__name__
            raise CallFailed(tool_errors.local_failed(call.name, why)) from None
        finally:
            ToolEffect.leave(token)

    async def _screen(self, call: ToolCallRequest, content: str) -> str:
        """The result as governance's injection screen lets the model see it (an empty one is not sent)."""
        if not content:
            return content
        screened = await screen_result(self._governance, self.run, call.name, content, max_bytes=self.data_limit)
        if screened.error is not None:
            raise CallFailed(screened.error)
        return screened.text

    async def _succeeded(self, call: ToolCallRequest, content: str, effect: CallEffect) -> str:
        """Record the result: cut to one run event, committed (a durable run's), reported."""
        # The model and the client get the same text, and it must fit in one run event.
        content = clip(content, self.data_limit, f"the result of {call.name}")
        await effect.settle(error=False, text=content)
        await self.emit(RunEvent(tool_result=ToolResult(tool_name=call.name, call_id=call.call_id, result=content)))
        return content

    async def _failed(self, call: ToolCallRequest, message: str, effect: CallEffect) -> str:
        """Record the failure: cut to one run event, committed (once the side effect started), reported."""
        message = clip(message, self.data_limit, f"the error of {call.name}")
        await effect.settle(error=True, text=message)
        await self.emit(RunEvent(tool_error=ToolError(tool_name=call.name, call_id=call.call_id, error=message)))
        return message
