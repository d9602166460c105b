"""Hosting the app's `@tool` functions on `atmo.tool.<name>`.

A failing tool is an answer, not a crash: bad arguments, exceptions and timeouts come back as
`ToolResult(is_error=True)` with an `Error: ...` text for the model — never a traceback.
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


def runtime_info(tools: Mapping[str, Tool[Any, Any]]) -> dict[str, Any]:
    """Sandbox's runtime-truth fragment: the tools it actually serves."""
    return {"sandbox": {"tools": sorted(tools)}} if tools else {}


def descriptors(tools: Mapping[str, Tool[Any, Any]]) -> list[ToolDescriptor]:
    """What sandbox publishes to `ATMO_TOOLS`."""
    return [t.descriptor(provider="sandbox") for t in tools.values()]


class ToolHost:
    """Answers tool calls for the tools of one app."""

    def __init__(self, tools: Mapping[str, Tool[Any, Any]]) -> None:
        """Host `tools` (by name)."""
        self._tools = dict(tools)

    def _handler(self, tool: Tool[Any, Any]) -> Callable[[ToolCall, MessageContext], Awaitable[ToolResult]]:
        async def handle(call: ToolCall, _ctx: MessageContext) -> ToolResult:
            return await self.call(tool, call)

        return handle

    async def call(self, tool: Tool[Any, Any], call: ToolCall) -> ToolResult:
        """Run one call within the tool's deadline."""
        try:
            arguments = json.loads(call.arguments_json or "{}")
        except json.JSONDecodeError:
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
        return ToolResult(call_id=call.call_id, content=content)

    def router(self) -> Router:
        """One subject per hosted tool."""
        router = Router()
        for tool in self._tools.values():
            router.add(subjects.tool(tool.name), ToolCall, self._handler(tool))
        return router


def _failure(call: ToolCall, message: str) -> ToolResult:
    return ToolResult(call_id=call.call_id, content=message, is_error=True)
