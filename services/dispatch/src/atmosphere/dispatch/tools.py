"""The tool choke point: every tool call of every runtime and entry path goes through `run`.

Order, as in Atmosphere: argument validation → governance check (fail-closed) → `tool-start`
→ approval gate (tools that ask for it) → execution with the tool's deadline → offload of an
over-long result to the workspace → `tool-result` or `tool-error`. The text returned is what
the model sees; refusals and failures are JSON (or `Error: ...`) texts, never exceptions.

Where a call executes: user tools on `atmo.tool.<name>` (the sandbox), the harness's plan and
file tools on `atmo.mem.tool.<name>` (memory, with the run's workspace), delegation tools in
this process (they start sub-runs).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from atmosphere.bus import Bus, BusError, Headers, NoRespondersError, RemoteError, RequestTimeoutError, subjects
from atmosphere.contracts.governance.v1.governance_pb2 import CheckToolCallRequest, Decision
from atmosphere.contracts.run.v1.run_pb2 import ApprovalRequired, RunEvent, RunRequest, ToolError, ToolResult, ToolStart
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, WorkspaceScope
from atmosphere.contracts.tool.v1.tool_pb2 import ToolResult as ToolReply
from atmosphere.dispatch.control import RunControl
from atmosphere.dispatch.schema import check_arguments
from atmosphere.sdk.builtin_tools import offload_path, offload_preview
from atmosphere.sdk.runtime import ToolCallRequest, ToolSpec

log = logging.getLogger("atmosphere.dispatch")

Emit = Callable[[RunEvent], Awaitable[None]]
LocalTool = Callable[[dict[str, Any]], Awaitable[str]]
"""A tool executed inside dispatch (delegation): arguments in, text for the model out."""


def _text(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"))


@dataclass
class ToolGateway:
    """Runs the tool calls of one run."""

    bus: Bus
    run: RunRequest
    emit: Emit
    tools: Mapping[str, ToolSpec]
    control: RunControl
    governance_timeout: float = 5.0
    approval_timeout: float = 300.0
    workspace: WorkspaceScope | None = None
    """The run's harness workspace (plan and file tools, offload); None without one."""
    memory_tools: frozenset[str] = frozenset()
    """Built-in tools of this agent served by memory (a user tool of the same name is not here)."""
    local_tools: Mapping[str, LocalTool] | None = None
    offload_threshold: int = 0
    """Results longer than this go to a workspace file (0: never; needs a workspace with files)."""
    offload: bool = False

    @property
    def _headers(self) -> Headers:
        return Headers(run_id=self.run.run_id, principal=self.run.principal if self.run.HasField("principal") else None)

    async def run_tool(self, call: ToolCallRequest) -> str:
        """Run one call; the returned text goes back to the model."""
        spec = self.tools.get(call.name)
        if spec is None:
            return _text(
                {"error": "unknown_tool", "tool": call.name, "message": f"No tool named '{call.name}' is available"}
            )
        try:
            arguments = json.loads(call.arguments_json or "{}")
        except json.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            return _text(
                {"error": "invalid_arguments", "tool": call.name, "details": ["the arguments are not a JSON object"]}
            )
        # The harness's plan and file tools check their own arguments, leniently (a model's
        # double-encoded `todos` is accepted) and with Atmosphere's exact error texts.
        problems = [] if call.name in self.memory_tools else check_arguments(spec.parameters, arguments)
        if problems:
            return _text({"error": "invalid_arguments", "tool": call.name, "details": problems})
        refusal = await self._govern(call)
        if refusal is not None:
            return refusal
        await self.emit(
            RunEvent(
                tool_start=ToolStart(tool_name=call.name, call_id=call.call_id, arguments_json=json.dumps(arguments))
            )
        )
        if spec.requires_approval:
            outcome = await self._approve(call, arguments)
            if isinstance(outcome, str):
                return outcome
            arguments = outcome
        return await self._execute(call, spec, arguments)

    async def _govern(self, call: ToolCallRequest) -> str | None:
        request = CheckToolCallRequest(
            run_id=self.run.run_id,
            agent=self.run.agent,
            tool_name=call.name,
            arguments_json=call.arguments_json,
            principal=self.run.principal,
        )
        try:
            decision = await self.bus.request(
                subjects.governance("check_tool"),
                request,
                Decision,
                timeout=self.governance_timeout,
                headers=self._headers,
            )
        except BusError as exc:
            log.warning("run %s: governance did not answer for %s (%s); refusing", self.run.run_id, call.name, exc)
            message = f"Error: governance is unavailable, so the tool call {call.name} was refused (fail-closed)"
            await self.emit(RunEvent(tool_error=ToolError(tool_name=call.name, call_id=call.call_id, error=message)))
            return message
        if not decision.allowed:
            policy = decision.policy or "default"
            return _text(
                {"status": "cancelled", "message": f"Tool {call.name} denied by policy '{policy}': {decision.reason}"}
            )
        return None

    async def _approve(self, call: ToolCallRequest, arguments: dict[str, Any]) -> dict[str, Any] | str:
        approval_id = "apr_" + secrets.token_hex(6)
        decision_future = self.control.expect_approval(approval_id)
        await self.emit(
            RunEvent(
                approval_required=ApprovalRequired(
                    approval_id=approval_id,
                    tool_name=call.name,
                    arguments_json=json.dumps(arguments),
                    message=f"Allow {call.name} to run with these arguments?",
                    expires_in_seconds=int(self.approval_timeout),
                )
            )
        )
        try:
            decision = await asyncio.wait_for(decision_future, self.approval_timeout)
        except TimeoutError:
            return _text({"status": "timeout", "message": "Approval timed out"})
        cancelled = _text({"status": "cancelled", "message": "Action cancelled by user"})
        if decision.action in {"approve", "yes"}:
            if not decision.payload_json:
                return arguments
            try:
                edited = json.loads(decision.payload_json)
            except json.JSONDecodeError:
                return cancelled
            edited = edited.get("arguments", edited) if isinstance(edited, dict) else None
            return edited if isinstance(edited, dict) else cancelled
        if decision.action == "respond" and decision.payload_json:
            return decision.payload_json
        return cancelled

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
        try:
            reply = await self.bus.request(subject, request, ToolReply, timeout=spec.timeout, headers=self._headers)
        except BusError as exc:
            return await self._fail(call, self._failure_text(call, spec, exc))
        for side_event in reply.events:  # e.g. the plan-update of write_todos, before the result
            await self.emit(side_event)
        if reply.is_error:
            return await self._fail(call, reply.content)
        return await self._succeed(call, reply.content)

    def _failure_text(self, call: ToolCallRequest, spec: ToolSpec, exc: BusError) -> str:
        """What the model learns when the bus could not deliver a tool call."""
        if isinstance(exc, RequestTimeoutError):
            seconds = int(spec.timeout) if spec.timeout == int(spec.timeout) else spec.timeout
            return _text(
                {
                    "error": "tool_timeout",
                    "tool": call.name,
                    "timeoutSeconds": seconds,
                    "message": f"Tool execution exceeded the {seconds}s deadline and was cancelled",
                }
            )
        if isinstance(exc, NoRespondersError):
            if call.name in self.memory_tools:
                return f"Error: the memory service is not serving {call.name} right now"
            return f"Error: no sandbox serves the tool {call.name} right now"
        if isinstance(exc, RemoteError):
            return f"Error: {exc.message}"
        return f"Error: the tool call failed ({exc})"

    async def _run_local(
        self, call: ToolCallRequest, spec: ToolSpec, local: LocalTool, arguments: dict[str, Any]
    ) -> str:
        try:
            content = await asyncio.wait_for(local(arguments), spec.timeout)
        except TimeoutError:
            return await self._fail(call, f"Error: {call.name} did not finish within {spec.timeout:g}s")
        except Exception as exc:
            log.exception("run %s: %s failed", self.run.run_id, call.name)
            return await self._fail(call, f"Error: {call.name} failed ({type(exc).__name__})")
        return await self._succeed(call, content)

    async def _succeed(self, call: ToolCallRequest, content: str) -> str:
        content = await self._maybe_offload(call, content)
        await self.emit(RunEvent(tool_result=ToolResult(tool_name=call.name, call_id=call.call_id, result=content)))
        return content

    async def _maybe_offload(self, call: ToolCallRequest, content: str) -> str:
        """An over-long result goes to a workspace file; the model gets a preview and the path.

        Never loses data: with no workspace, a disabled threshold, or any failure to save, the
        whole result stays inline.
        """
        if not self.offload or self.workspace is None or self.offload_threshold <= 0:
            return content
        if len(content) <= self.offload_threshold:
            return content
        path = offload_path(call.name)
        save = ToolCall(
            call_id=uuid.uuid4().hex,
            name="write_file",
            arguments_json=json.dumps({"path": path, "content": content}),
            run_id=self.run.run_id,
            conversation_id=self.run.conversation_id,
            agent=self.run.agent,
            principal=self.run.principal,
            workspace=self.workspace,
        )
        try:
            reply = await self.bus.request(
                subjects.memory_tool("write_file"), save, ToolReply, timeout=10.0, headers=self._headers
            )
        except BusError as exc:
            log.debug("run %s: offload of %s failed (%s); inline", self.run.run_id, call.name, exc)
            return content
        if reply.is_error:
            log.debug("run %s: offload of %s refused (%s); inline", self.run.run_id, call.name, reply.content)
            return content
        return offload_preview(content, path)

    async def _fail(self, call: ToolCallRequest, message: str) -> str:
        await self.emit(RunEvent(tool_error=ToolError(tool_name=call.name, call_id=call.call_id, error=message)))
        return message
