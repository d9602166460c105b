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
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from atmosphere.bus import Bus, BusError, MessageContext, Router, subjects
from atmosphere.bus.sizes import DEFAULT_MAX_PAYLOAD, clip, data_budget, utf8_len
from atmosphere.bus.text import replace_lone_surrogates
from atmosphere.contracts.run.v1.run_pb2 import ApprovalRequired as ApprovalRequest
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolDescriptor, ToolReply
from atmosphere.sdk import ApprovalRequired, Tool
from atmosphere.sdk.host import ToolArgumentsError, ToolSignal

log = logging.getLogger("atmosphere.sandbox")

DEFAULT_MAX_RESULT_BYTES: Final = 16 * 1024 * 1024
"""The largest result passed on whole (`ATMOSPHERE_SANDBOX__MAX_RESULT_BYTES`); a longer one is cut."""


def runtime_info(tools: Mapping[str, Tool[Any, Any]]) -> dict[str, Any]:
    """Sandbox's runtime-truth fragment: the tools it actually serves."""
    return {"sandbox": {"tools": sorted(tools)}} if tools else {}


def descriptors(tools: Mapping[str, Tool[Any, Any]]) -> list[ToolDescriptor]:
    """What sandbox publishes to `ATMO_TOOLS`."""
    return [t.descriptor(provider="sandbox") for t in tools.values()]


class ToolHost:
    """Answers tool calls for the tools of one app."""

    def __init__(
        self,
        tools: Mapping[str, Tool[Any, Any]],
        *,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        objects: Bus | None = None,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    ) -> None:
        """Host `tools` (by name), answering within bus messages of `max_payload` bytes.

        A result larger than one message is stored through `objects` (up to `max_result_bytes`);
        without it, such a result is cut to fit in the reply.
        """
        self._tools = dict(tools)
        self._inline_bytes = data_budget(max_payload)
        self._objects = objects
        self._max_result_bytes = max_result_bytes

    def _handler(self, tool: Tool[Any, Any]) -> Callable[[ToolCall, MessageContext], Awaitable[ToolReply]]:
        async def handle(call: ToolCall, _ctx: MessageContext) -> ToolReply:
            return await self.call(tool, call)

        return handle

    async def call(self, tool: Tool[Any, Any], call: ToolCall) -> ToolReply:
        """Run one call within the tool's deadline; a result too large for the reply is stored."""
        result = await self._call(tool, call)
        if utf8_len(result.content) <= self._inline_bytes:
            return result
        if result.is_error or self._objects is None:
            return _cut(result, tool.name, self._inline_bytes)
        return await self._stored(result, tool.name, self._objects)

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
        try:
            arguments = json.loads(call.arguments_json or "{}")
        except (ValueError, RecursionError):  # not JSON, nested too deep, or a number too long
            return _failure(call, "Error: the arguments are not valid JSON")
        if not isinstance(arguments, dict):
            return _failure(call, "Error: the arguments must be a JSON object")
        return await self._invoke(tool, call, arguments)

    async def _invoke(self, tool: Tool[Any, Any], call: ToolCall, arguments: dict[str, Any]) -> ToolReply:
        try:
            content = await asyncio.wait_for(tool.invoke(arguments), tool.timeout)
        except ToolArgumentsError as exc:
            return _failure(call, json.dumps({"error": "invalid_arguments", "tool": tool.name, "details": exc.details}))
        except TimeoutError:
            return _failure(call, f"Error: {tool.name} did not finish within {tool.timeout:g}s")
        except ApprovalRequired as exc:
            return _approval_request(call, exc.message)
        except ToolSignal as exc:  # the tool's own words, meant for the model
            return _failure(call, exc.model_text())
        except Exception as exc:
            log.warning("tool %s failed on run %s", tool.name, call.run_id, exc_info=True)
            return _failure(call, f"Error: {str(exc) or type(exc).__name__}")
        return ToolReply(call_id=call.call_id, content=replace_lone_surrogates(content))

    def router(self) -> Router:
        """One subject per hosted tool."""
        router = Router()
        for tool in self._tools.values():
            router.add(subjects.tool(tool.name), ToolCall, self._handler(tool))
        return router


def _approval_request(call: ToolCall, message: str) -> ToolReply:
    """The reply of a tool that raised `ApprovalRequired`: dispatch asks the user with `message`."""
    request = ApprovalRequest(tool_name=call.name, arguments_json=call.arguments_json, message=message)
    return ToolReply(call_id=call.call_id, events=[RunEvent(approval_required=request)])


def _failure(call: ToolCall, message: str) -> ToolReply:
    return ToolReply(call_id=call.call_id, content=replace_lone_surrogates(message), is_error=True)


def _cut(result: ToolReply, tool: str, max_bytes: int) -> ToolReply:
    """`result` with its content cut to `max_bytes` of UTF-8, ending with the marker."""
    log.warning("tool %s returned %d bytes; cut to fit in one bus message", tool, utf8_len(result.content))
    result.content = clip(result.content, max_bytes, f"the result of {tool}")
    result.truncated = True
    return result
