"""The app's MCP servers in this sandbox: their tools listed while they answer, their calls run.

Every `refresh` seconds each declared server is asked for its tools (`tools/list`, bounded). A
server that answers has its tools' descriptors written to `ATMO_TOOLS` (provider `mcp`, key and
model-facing name `<server>__<tool>`, parameters its `inputSchema`, timeout the server's), and
those it no longer lists deleted; one that does not answer has all of its descriptors deleted,
and they come back at the first refresh it answers again. Dispatch offers an agent the listed
tools of the servers it declares. The info says, per server, what answered at the last refresh:
`{"mcp": {"docs": "ACTIVE(2 tools)", "files": "INACTIVE(timed out)"}}`.

Calls arrive on `atmo.tool.mcp:<server>` (`ToolCall.name` the model-facing name), already
validated, governed and approved by dispatch's choke point; the reply is the tool's text, or an
`Error: ...` naming the server when it is down, slow, or refuses (`mcp_client.errors`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final

import mcp_types as types

from atmosphere.bus import Bus, BusError, MessageContext, Router, subjects
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolDescriptor, ToolKind, ToolReply
from atmosphere.sandbox import metrics
from atmosphere.sandbox.mcp_client import errors
from atmosphere.sandbox.mcp_client.connection import McpConnection, McpRefusedError, McpTimings, McpUnavailableError
from atmosphere.sandbox.outcome import parse_arguments
from atmosphere.sdk import McpServer
from atmosphere.sdk.host import MCP_SEPARATOR, mcp_governed_name, mcp_tool_name

log = logging.getLogger("atmosphere.sandbox")

PROVIDER: Final = "mcp"
"""`ToolDescriptor.provider` of an MCP server's tool."""
MAX_DESCRIPTION_CHARS: Final = 2048
MAX_SCHEMA_BYTES: Final = 64 * 1024
"""A tool whose input schema is larger is not offered (one descriptor, one bus message)."""

Fitted = Callable[[ToolReply, str], Awaitable[ToolReply]]
"""Shapes a reply to what the bus carries (`ToolHost.fitted`): a large result stored, or cut."""


def _kind(tool: types.Tool) -> ToolKind.ValueType:
    """A read-only tool (by the server's own hint) reads; any other may change the world."""
    hints = tool.annotations
    if hints is not None and hints.read_only_hint:
        return ToolKind.TOOL_KIND_READ
    return ToolKind.TOOL_KIND_UNSPECIFIED


def descriptor_of(server: McpServer, tool: types.Tool) -> ToolDescriptor | None:
    """The descriptor of one listed tool, or None when it cannot be offered (no valid name, schema too large)."""
    name = mcp_tool_name(server.name, tool.name)
    schema = json.dumps(tool.input_schema)
    if name is None or len(schema.encode("utf-8")) > MAX_SCHEMA_BYTES:
        return None
    hints = tool.annotations
    return ToolDescriptor(
        name=name,
        description=(tool.description or tool.title or "")[:MAX_DESCRIPTION_CHARS],
        parameters_json_schema=schema,
        kind=_kind(tool),
        timeout_seconds=server.timeout,
        provider=PROVIDER,
        # Re-run after a worker's death only when the server says the tool changes nothing.
        idempotent=bool(hints is not None and hints.read_only_hint),
    )


def result_text(result: types.CallToolResult) -> str:
    """What the model reads of a result: its text blocks; other blocks named, not inlined."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        else:
            parts.append(f"[{block.type} content omitted]")
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content)
    return "\n".join(parts)


class McpServers:
    """The MCP servers of one app in this sandbox: sessions, listings, calls, runtime truth."""

    def __init__(
        self,
        servers: Mapping[str, McpServer],
        *,
        timings: McpTimings | None = None,
        max_tools: int = 128,
        fitted: Fitted | None = None,
    ) -> None:
        """Serve `servers` (by name); each lists at most `max_tools` tools; replies shaped by `fitted`."""
        timings = timings or McpTimings()
        self._connections = {name: McpConnection(server, timings) for name, server in servers.items()}
        self._max_tools = max_tools
        self._fitted = fitted
        self._listed: dict[str, dict[str, ToolDescriptor]] = {name: {} for name in servers}
        """What each server listed at the last refresh that it answered, by model-facing name."""
        self._state: dict[str, str] = dict.fromkeys(servers, "INACTIVE(not listed yet)")

    def info(self) -> dict[str, str]:
        """Each server's state at its last refresh: `ACTIVE(<n> tools)` or `INACTIVE(<why>)`."""
        return dict(self._state)

    def listed(self, server: str) -> Mapping[str, ToolDescriptor]:
        """The tools `server` listed at its last answered refresh (none while it does not answer)."""
        return dict(self._listed.get(server, {}))

    async def refresh(self, bus: Bus) -> None:
        """Ask every server for its tools now and publish what answers (never raises for a server)."""
        await asyncio.gather(*(self._refresh_one(bus, name) for name in self._connections))

    async def _refresh_one(self, bus: Bus, name: str) -> None:
        connection = self._connections[name]
        try:
            tools = await connection.list_tools()
        except McpUnavailableError as exc:
            state = f"INACTIVE({exc.why})"
            if self._state[name] != state:  # once per change, not once per refresh
                log.warning("MCP server %s is not answering (%s); none of its tools is offered", name, exc.why)
            self._state[name] = state
            await self._publish(bus, name, {})
            return
        offered: dict[str, ToolDescriptor] = {}
        for tool in tools[: self._max_tools]:
            descriptor = descriptor_of(connection.server, tool)
            if descriptor is None:
                log.warning("MCP server %s: its tool %r has no usable name or schema; not offered", name, tool.name)
            else:
                offered[descriptor.name] = descriptor
        if len(tools) > self._max_tools:
            log.warning("MCP server %s lists %d tools; the first %d are offered", name, len(tools), self._max_tools)
        if not self._state[name].startswith("ACTIVE"):
            log.info("MCP server %s answers: %d tool(s)", name, len(offered))
        self._state[name] = f"ACTIVE({len(offered)} tool{'' if len(offered) == 1 else 's'})"
        await self._publish(bus, name, offered)

    async def _publish(self, bus: Bus, name: str, offered: dict[str, ToolDescriptor]) -> None:
        """Write `offered` as `name`'s tools in `ATMO_TOOLS`, deleting those it lists no more."""
        gone = [key for key in self._listed[name] if key not in offered]
        try:
            # Each refresh writes them all again: another replica's withdrawal may have deleted them.
            for key, descriptor in offered.items():
                await bus.kv_put(subjects.TOOLS_BUCKET, key, descriptor)
            for key in gone:
                await bus.kv_delete(subjects.TOOLS_BUCKET, key)
        except BusError as exc:
            # Not recorded as listed: the next refresh writes it all again.
            log.warning("MCP server %s: its tools could not be published (%s)", name, exc)
            self._listed[name] = {}
            return
        self._listed[name] = offered

    async def withdraw(self, bus: Bus) -> None:
        """Delete every descriptor this sandbox published (it stops answering for them)."""
        for name in self._connections:
            with contextlib.suppress(BusError):
                await self._publish(bus, name, {})

    def router(self) -> Router:
        """One subject per server: `atmo.tool.mcp:<server>`."""
        router = Router()
        for name in self._connections:
            router.add(subjects.mcp_tool(name), ToolCall, self._handler(name))
        return router

    def _handler(self, server: str) -> Callable[[ToolCall, MessageContext], Awaitable[ToolReply]]:
        async def handle(call: ToolCall, _ctx: MessageContext) -> ToolReply:
            reply = await self.call(server, call)
            return await self._fitted(reply, call.name) if self._fitted is not None else reply

        return handle

    async def call(self, server: str, call: ToolCall) -> ToolReply:
        """Run one call of `server`'s tool named (for the model) `call.name`."""
        prefix = f"{server}{MCP_SEPARATOR}"
        if not call.name.startswith(prefix):
            return _error(call, errors.not_its_tool(server, call.name))
        tool = call.name.removeprefix(prefix)
        governed = mcp_governed_name(call.name)
        arguments = parse_arguments(call.arguments_json)
        if not isinstance(arguments, dict):
            return _error(call, arguments.text)
        return await self._run(self._connections[server], call, tool, governed, arguments)

    async def _run(
        self, connection: McpConnection, call: ToolCall, tool: str, governed: str, arguments: dict[str, Any]
    ) -> ToolReply:
        started = time.perf_counter()
        reply, outcome = await self._attempt(connection, call, tool, governed, arguments)
        metrics.executed("mcp", outcome, started)
        return reply

    async def _attempt(
        self, connection: McpConnection, call: ToolCall, tool: str, governed: str, arguments: dict[str, Any]
    ) -> tuple[ToolReply, str]:
        """The reply to one call of the server's `tool`, and its outcome (`metrics.OUTCOMES`)."""
        server = connection.server
        try:
            result = await connection.call_tool(tool, arguments)
        except McpUnavailableError as exc:
            log.warning("run %s: MCP server %s did not answer %s (%s)", call.run_id, server.name, governed, exc.why)
            return _error(call, errors.server_unavailable(server.name, governed, exc.why)), "error"
        except McpRefusedError as exc:
            return _error(call, errors.server_refused(server.name, governed, exc.message)), "error"
        except TimeoutError:
            log.warning("run %s: %s took over %gs", call.run_id, governed, server.timeout)
            return _error(call, errors.timed_out(server.name, governed, server.timeout)), "timeout"
        text = result_text(result)
        if result.is_error:
            return _error(call, errors.tool_failed(governed, text)), "error"
        return ToolReply(call_id=call.call_id, content=text), "ok"

    async def close(self) -> None:
        """End every session (stdio children stopped)."""
        for connection in self._connections.values():
            await connection.close()


def _error(call: ToolCall, text: str) -> ToolReply:
    return ToolReply(call_id=call.call_id, content=text, is_error=True)


async def _refresh_forever(servers: McpServers, bus: Bus, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            await servers.refresh(bus)
        except Exception:
            # Never let the refresher die: the listing would freeze as it was.
            log.exception("refreshing the MCP servers' tools failed unexpectedly; retrying")


@contextlib.asynccontextmanager
async def serving_mcp(servers: McpServers, bus: Bus, *, refresh: float) -> AsyncIterator[McpServers]:
    """List every server now, then again every `refresh` seconds; on exit withdraw the tools, end the sessions."""
    try:
        await servers.refresh(bus)
        refresher = asyncio.create_task(_refresh_forever(servers, bus, refresh), name="mcp-refresh")
        try:
            yield servers
        finally:
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher
            await servers.withdraw(bus)
    finally:
        await servers.close()
