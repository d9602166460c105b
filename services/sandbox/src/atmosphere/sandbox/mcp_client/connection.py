"""One declared MCP server's client session in this sandbox: opened when first needed, reopened after a failure.

The session (the SDK's `mcp.Client`, over streamable HTTP or a child process speaking stdio) is
held by a task of its own (`_hold`): the SDK's transports are anyio task groups, which must be
entered and left by one task. Calls and listings from any task use it; every one is bounded
(`connect_timeout`, a listing's and a call's own timeout). A session whose transport fails is
dropped (its child process stopped) and the next use opens a new one; a call that only timed out
keeps it (a slow tool is not a dead server).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

from atmosphere.sdk import McpServer

log = logging.getLogger("atmosphere.sandbox")

MAX_LIST_PAGES = 16
"""Pages of `tools/list` read at most (a server paging without end is cut off)."""


class McpUnavailableError(Exception):
    """The server did not answer (not reachable, not started, no session, too slow); `why` says how."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class McpRefusedError(Exception):
    """The server answered with a protocol error (`MCPError`): its message, for the model."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class McpTimings:
    """How long a connection waits, in seconds (injectable: tests shorten them)."""

    connect: float = 10.0
    """To start the session (spawn or connect, then the handshake)."""
    listing: float = 5.0
    """For one full `tools/list`."""


def _why(exc: BaseException) -> str:
    """A short reason, without the server's URL or command (they may hold secrets)."""
    if isinstance(exc, BaseExceptionGroup):
        first = exc.exceptions[0] if exc.exceptions else exc
        return _why(first)
    if isinstance(exc, TimeoutError):
        return "timed out"
    return type(exc).__name__


class McpConnection:
    """The client session of one MCP server, shared by every call this sandbox makes to it."""

    def __init__(self, server: McpServer, timings: McpTimings) -> None:
        """Connect to `server` when first used (a stdio child's stderr is the sandbox's)."""
        self.server = server
        self._timings = timings
        self._client: Client | None = None
        self._holder: asyncio.Task[None] | None = None
        self._release = asyncio.Event()
        self._lock = asyncio.Lock()

    def _target(self) -> StdioServerParameters | str:
        server = self.server
        if server.transport == "http":
            return server.url
        return StdioServerParameters(
            command=server.command[0], args=list(server.command[1:]), env=dict(server.env) or None, cwd=server.cwd
        )

    async def _hold(self, ready: asyncio.Future[Client], release: asyncio.Event) -> None:
        """Open the session, hand it over, keep it until released (or until its transport fails)."""
        try:
            # No response cache: a listing must ask the server (is it still there?), never a memory of it.
            client = Client(self._target(), cache=None, read_timeout_seconds=self.server.timeout)
            async with client:
                ready.set_result(client)
                await release.wait()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(McpUnavailableError(_why(exc)))
            else:
                log.info("MCP server %s: its session ended (%s)", self.server.name, _why(exc))
        finally:
            if not ready.done():
                ready.cancel()

    async def _session(self) -> Client:
        """The open session, opened now if there is none (raises `McpUnavailableError`)."""
        async with self._lock:
            if self._client is not None and self._holder is not None and not self._holder.done():
                return self._client
            await self._drop()
            ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
            # Its outcome is read here, or not at all once this wait gave up: never reported as lost.
            ready.add_done_callback(lambda done: done.cancelled() or done.exception())
            self._release = asyncio.Event()
            self._holder = asyncio.create_task(self._hold(ready, self._release), name=f"mcp-{self.server.name}")
            try:
                async with asyncio.timeout(self._timings.connect):
                    self._client = await asyncio.shield(ready)
            except (TimeoutError, asyncio.CancelledError, McpUnavailableError) as exc:
                await self._abandon()
                if isinstance(exc, McpUnavailableError):
                    raise
                if isinstance(exc, TimeoutError):
                    msg = f"no session within {self._timings.connect:g}s"
                    raise McpUnavailableError(msg) from None
                raise
            log.info("MCP server %s (%s): session open", self.server.name, self.server.describe())
            return self._client

    async def _abandon(self) -> None:
        """Stop a session that never opened: its opening is cancelled (a stdio child is stopped, bounded)."""
        holder, self._holder, self._client = self._holder, None, None
        if holder is not None:
            holder.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await holder

    async def _drop(self) -> None:
        """Let the session go (its child process stopped): the next use opens a new one."""
        holder, self._holder, self._client = self._holder, None, None
        if holder is None:
            return
        self._release.set()
        try:
            async with asyncio.timeout(self._timings.connect):
                await asyncio.shield(holder)
        except (TimeoutError, Exception):
            holder.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await holder

    async def _broken(self, client: Client) -> None:
        """The transport under `client` failed: drop it, unless a newer session replaced it already."""
        async with self._lock:
            if self._client is client:
                await self._drop()

    async def list_tools(self) -> list[types.Tool]:
        """Every tool the server lists now (raises `McpUnavailableError` when it does not answer in time)."""
        client = await self._session()
        tools: list[types.Tool] = []
        try:
            async with asyncio.timeout(self._timings.listing):
                cursor: str | None = None
                for _ in range(MAX_LIST_PAGES):
                    page = await client.list_tools(cursor=cursor, cache_mode="refresh")
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if cursor is None:
                        break
        except TimeoutError:
            msg = f"tools/list took over {self._timings.listing:g}s"
            raise McpUnavailableError(msg) from None
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                await self._broken(client)
                raise McpUnavailableError("connection closed") from None
            raise McpUnavailableError(f"tools/list refused: {exc.message}") from None
        except Exception as exc:
            await self._broken(client)
            raise McpUnavailableError(_why(exc)) from None
        return tools

    async def call_tool(self, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """The server's result of one call (raises `McpUnavailableError`, `McpRefusedError`, or `TimeoutError`).

        The server's `timeout` bounds the whole call, a session opened for it included: dispatch
        waits that long (and a little more) for the answer.
        """
        async with asyncio.timeout(self.server.timeout):
            client = await self._session()
            return await self._called(client, tool, arguments)

    async def _called(self, client: Client, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
        try:
            return await client.call_tool(tool, arguments)
        except TimeoutError:
            raise
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                raise TimeoutError from None
            if exc.code == CONNECTION_CLOSED:  # the server's process ended, or its connection broke
                await self._broken(client)
                raise McpUnavailableError("connection closed") from None
            raise McpRefusedError(exc.message) from None
        except Exception as exc:
            await self._broken(client)
            raise McpUnavailableError(_why(exc)) from None

    async def close(self) -> None:
        """End the session (a stdio child is stopped); nothing is left running."""
        async with self._lock:
            await self._drop()
