"""Hosting the app's `@tool` functions on `atmo.tool.<name>`.

A failing tool is an answer, not a crash: bad arguments, exceptions and timeouts come back as
`ToolResult(is_error=True)` with an `Error: ...` text for the model — never a traceback.

A result must fit in one bus message (nats-server closes a connection that sends more than its
`max_payload`), with room for the run event dispatch wraps around it: a longer result is cut,
ending with a marker that says so and how large it was (`ToolResult.truncated`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from atmosphere.bus import MessageContext, Router, subjects
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolDescriptor, ToolResult
from atmosphere.sdk import Tool, ToolArgumentsError

log = logging.getLogger("atmosphere.sandbox")

DEFAULT_MAX_PAYLOAD = 1 << 20
"""nats-server's default `max_payload` (1 MiB), for a host built without a bus."""
ENVELOPE_ROOM = 16 * 1024
"""Bytes kept free in a result for dispatch's run event around it (ids, principal, timestamps)."""


def runtime_info(tools: Mapping[str, Tool[Any, Any]]) -> dict[str, Any]:
    """Sandbox's runtime-truth fragment: the tools it actually serves."""
    return {"sandbox": {"tools": sorted(tools)}} if tools else {}


def descriptors(tools: Mapping[str, Tool[Any, Any]]) -> list[ToolDescriptor]:
    """What sandbox publishes to `ATMO_TOOLS`."""
    return [t.descriptor(provider="sandbox") for t in tools.values()]


class ToolHost:
    """Answers tool calls for the tools of one app."""

    def __init__(self, tools: Mapping[str, Tool[Any, Any]], *, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        """Host `tools` (by name); results are sized to fit in a bus message of `max_payload` bytes."""
        self._tools = dict(tools)
        self._max_result_bytes = max(1024, max_payload - ENVELOPE_ROOM)

    def _handler(self, tool: Tool[Any, Any]) -> Callable[[ToolCall, MessageContext], Awaitable[ToolResult]]:
        async def handle(call: ToolCall, _ctx: MessageContext) -> ToolResult:
            return await self.call(tool, call)

        return handle

    async def call(self, tool: Tool[Any, Any], call: ToolCall) -> ToolResult:
        """Run one call within the tool's deadline; its result cut to fit in one bus message."""
        result = await self._call(tool, call)
        return _fitted(result, tool.name, self._max_result_bytes)

    async def _call(self, tool: Tool[Any, Any], call: ToolCall) -> ToolResult:
        try:
            arguments = json.loads(call.arguments_json or "{}")
        except (ValueError, RecursionError):  # not JSON, nested too deep, or a number too long
            return _failure(call, "Error: the arguments are not valid JSON")
        if not isinstance(arguments, dict):
            return _failure(call, "Error: the arguments must be a JSON object")
        try:
            content = await asyncio.wait_for(tool.invoke(arguments), tool.timeout)
        except ToolArgumentsError as exc:
            return _failure(call, json.dumps({"error": "invalid_arguments", "tool": tool.name, "details": exc.details}))
        except TimeoutError:
            return _failure(call, f"Error: {tool.name} did not finish within {tool.timeout:g}s")
        except Exception as exc:
            log.warning("tool %s failed on run %s", tool.name, call.run_id, exc_info=True)
            return _failure(call, f"Error: {str(exc) or type(exc).__name__}")
        return ToolResult(call_id=call.call_id, content=_text(content))

    def router(self) -> Router:
        """One subject per hosted tool."""
        router = Router()
        for tool in self._tools.values():
            router.add(subjects.tool(tool.name), ToolCall, self._handler(tool))
        return router


def _text(content: str) -> str:
    """`content` as protobuf accepts it: a lone surrogate (from a tool's own text) becomes `?`."""
    try:
        content.encode("utf-8")
    except UnicodeEncodeError:
        return content.encode("utf-8", errors="replace").decode("utf-8")
    return content


def _failure(call: ToolCall, message: str) -> ToolResult:
    return ToolResult(call_id=call.call_id, content=_text(message), is_error=True)


def _fitted(result: ToolResult, tool: str, max_bytes: int) -> ToolResult:
    """`result` with its content cut to `max_bytes` of UTF-8."""
    data = result.content.encode("utf-8")
    if len(data) <= max_bytes:
        return result
    marker = f"\n…[truncated: the result of {tool} is {len(data)} bytes; only the first {{kept}} bytes are kept]"
    kept = data[: max_bytes - len(marker.format(kept=len(data)).encode())].decode("utf-8", errors="ignore")
    log.warning("tool %s returned %d bytes; cut to fit in one bus message", tool, len(data))
    result.content = kept + marker.format(kept=len(kept.encode()))
    result.truncated = True
    return result
