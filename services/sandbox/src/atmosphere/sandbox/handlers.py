"""Hosting the app's `@tool` functions on `atmo.tool.<name>`.

A failing tool is an answer, not a crash: bad arguments, exceptions and timeouts come back as
`ToolReply(is_error=True)` with an `Error: ...` text for the model — never a traceback. A
tool's own signals (`atmosphere.sdk.ToolError`, `ModelRetry`) are such failures with the exact
text the tool chose; `ApprovalRequired` is no failure: the reply carries an `approval_required`
event, and dispatch asks the user and calls the tool again once approved.

A result travels whole. One that fits in one bus message, with room for the run event dispatch
wraps around it (`atmosphere.bus.sizes.data_budget`), is the reply's `content`; a larger one is
stored in the object bucket `ATMO_TOOL_RESULTS` and the reply names it
(`ToolReply.result_object`), for dispatch to read back, offload to the workspace or cut for
the model, and delete. Only a result over `max_result_bytes`
(`ATMOSPHERE_SANDBOX__MAX_RESULT_BYTES`), or one that cannot be stored, is cut, ending with a
marker that says so and how large it was (`ToolReply.truncated`).

Where a tool runs is the host's `ToolExecutor`: by default in this process (`InProcessTools`,
what the agent test kit uses with `tool_workers=0`), and in `serve()` in worker processes
(`atmosphere.sandbox.workers.ToolWorkers`), so that a tool that crashes the interpreter, hangs in
sync code or allocates without bound costs its worker, not the service. Both run a call through
`atmosphere.sandbox.outcome.run_tool`, so a call's reply is the same either way; a worker cuts a
result to the host's limits itself (`ResultLimits`) before it sends it. Each call is counted by
its outcome and timed here, whichever executor ran it (`atmosphere.sandbox.metrics`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Protocol

from atmosphere.bus import Bus, BusError, MessageContext, Router, subjects
from atmosphere.bus.sizes import DEFAULT_MAX_PAYLOAD, clip, data_budget, utf8_len
from atmosphere.contracts.run.v1.run_pb2 import ApprovalRequired as ApprovalRequest
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolDescriptor, ToolReply
from atmosphere.sandbox import metrics
from atmosphere.sandbox.outcome import ResultLimits, ToolOutcome, parse_arguments, run_tool
from atmosphere.sdk import Tool

log = logging.getLogger("atmosphere.sandbox")

DEFAULT_MAX_RESULT_BYTES: Final = 16 * 1024 * 1024
"""The largest result passed on whole (`ATMOSPHERE_SANDBOX__MAX_RESULT_BYTES`); a longer one is cut."""


def runtime_info(
    tools: Mapping[str, Tool[Any, Any]],
    builtins: Mapping[str, str] | None = None,
    mcp: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Sandbox's runtime-truth fragment: the app's tools it serves, and its own tools' state.

    `builtins` is what the sandbox's own tools report (`{"code_exec": "ACTIVE(bwrap)", "eval":
    "INACTIVE(disabled)"}`), listed even when the app has no tools; `mcp` what each declared MCP
    server answered at its last listing (`{"docs": "ACTIVE(2 tools)"}`), when the app has any.
    """
    fragment: dict[str, Any] = {"tools": sorted(tools)} if tools else {}
    fragment.update(builtins or {})
    if mcp:
        fragment["mcp"] = dict(mcp)
    return {"sandbox": fragment} if fragment else {}


def descriptors(tools: Mapping[str, Tool[Any, Any]]) -> list[ToolDescriptor]:
    """What sandbox publishes to `ATMO_TOOLS`."""
    return [t.descriptor(provider="sandbox") for t in tools.values()]


class ToolExecutor(Protocol):
    """Where a tool call runs: this process, or a worker process."""

    async def run(
        self, tool: Tool[Any, Any], call: ToolCall, arguments: dict[str, Any], limits: ResultLimits
    ) -> ToolOutcome:
        """Run `call` of `tool` (its `arguments` already parsed) within the tool's timeout."""
        ...


class InProcessTools:
    """Runs tools in this process (a tool that crashes or wedges it takes the process with it)."""

    async def run(
        self, tool: Tool[Any, Any], call: ToolCall, arguments: dict[str, Any], _limits: ResultLimits
    ) -> ToolOutcome:
        """Run `call` of `tool` here; the host cuts what is too large."""
        return await run_tool(tool, arguments, run_id=call.run_id)


class ToolHost:
    """Answers tool calls for the tools of one app."""

    def __init__(
        self,
        tools: Mapping[str, Tool[Any, Any]],
        *,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        objects: Bus | None = None,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        executor: ToolExecutor | None = None,
    ) -> None:
        """Host `tools` (by name), answering within bus messages of `max_payload` bytes.

        A result larger than one message is stored through `objects` (up to `max_result_bytes`);
        without it, such a result is cut to fit in the reply. The tools run on `executor`
        (default: in this process).
        """
        self._tools = dict(tools)
        self._inline_bytes = data_budget(max_payload)
        self._objects = objects
        self._max_result_bytes = max_result_bytes
        self._executor: ToolExecutor = executor or InProcessTools()
        # What a reply may hold: a result over one message is stored (up to the maximum) or, with
        # no object store, cut to one message. A worker cuts to these itself, before it sends.
        kept = max_result_bytes if objects is not None else self._inline_bytes
        self._limits = ResultLimits(self._inline_bytes, kept)

    def _handler(self, tool: Tool[Any, Any]) -> Callable[[ToolCall, MessageContext], Awaitable[ToolReply]]:
        async def handle(call: ToolCall, _ctx: MessageContext) -> ToolReply:
            return await self.call(tool, call)

        return handle

    async def call(self, tool: Tool[Any, Any], call: ToolCall) -> ToolReply:
        """Run one call within the tool's deadline; a result too large for the reply is stored."""
        return await self.fitted(await self._call(tool, call), tool.name)

    async def fitted(self, result: ToolReply, tool: str) -> ToolReply:
        """`result` as one reply carries it: whole, stored as an object, or cut (an MCP tool's too)."""
        if utf8_len(result.content) <= self._inline_bytes:
            return result
        if result.is_error or self._objects is None:
            return _cut(result, tool, self._inline_bytes)
        return await self._stored(result, tool, self._objects)

    async def _stored(self, result: ToolReply, tool: str, objects: Bus) -> ToolReply:
        """`result` with its content moved to an object (cut first if over `max_result_bytes`)."""
        over = utf8_len(result.content) > self._max_result_bytes
        kept = clip(result.content, self._max_result_bytes, f"the result of {tool}")
        name = uuid.uuid4().hex
        try:
            await objects.object_put(subjects.TOOL_RESULTS_BUCKET, name, kept.encode("utf-8"))
        except BusError as exc:
            log.warning("tool %s: its result could not be stored (%s); cut to fit in one message", tool, exc)
            return _cut(result, tool, self._inline_bytes)
        if over:
            log.warning("tool %s returned more than %d bytes; cut", tool, self._max_result_bytes)
            result.truncated = True
        result.content = ""
        result.result_object = name
        return result

    async def _call(self, tool: Tool[Any, Any], call: ToolCall) -> ToolReply:
        started = time.perf_counter()
        arguments = parse_arguments(call.arguments_json)
        if isinstance(arguments, ToolOutcome):
            outcome = arguments
        else:
            outcome = await self._executor.run(tool, call, arguments, self._limits)
        metrics.executed("tool", outcome_label(outcome), started)
        if outcome.kind == "approval":
            return _approval_request(call, outcome.text)
        return ToolReply(
            call_id=call.call_id, content=outcome.text, is_error=outcome.kind == "error", truncated=outcome.truncated
        )

    def router(self) -> Router:
        """One subject per hosted tool."""
        router = Router()
        for tool in self._tools.values():
            router.add(subjects.tool(tool.name), ToolCall, self._handler(tool))
        return router


def outcome_label(outcome: ToolOutcome) -> str:
    """How `atmosphere_sandbox_executions_total` names `outcome` (`metrics.OUTCOMES`)."""
    if outcome.kind == "approval":
        return "approval"
    if outcome.timed_out:
        return "timeout"
    if outcome.killed:
        return "killed"
    return "error" if outcome.kind == "error" else "ok"


def _approval_request(call: ToolCall, message: str) -> ToolReply:
    """The reply of a tool that raised `ApprovalRequired`: dispatch asks the user with `message`."""
    request = ApprovalRequest(tool_name=call.name, arguments_json=call.arguments_json, message=message)
    return ToolReply(call_id=call.call_id, events=[RunEvent(approval_required=request)])


def _cut(result: ToolReply, tool: str, max_bytes: int) -> ToolReply:
    """`result` with its content cut to `max_bytes` of UTF-8, ending with the marker."""
    log.warning("tool %s returned %d bytes; cut to fit in one bus message", tool, utf8_len(result.content))
    result.content = clip(result.content, max_bytes, f"the result of {tool}")
    result.truncated = True
    return result
