"""Serving the app's MCP servers from `serve()`, or saying why they are not served.

The MCP SDK is the sandbox's `mcp` extra: it is imported (through `atmosphere.sandbox.mcp_client`)
only when the app declares a server. Without the SDK, each declared server is reported
`INACTIVE(...)` and none of its tools is offered: runtime truth, never a tool that cannot run.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING

from atmosphere.bus import Bus, Router
from atmosphere.sandbox.mcp_client.errors import sdk_missing
from atmosphere.sandbox.settings import SandboxOptions
from atmosphere.sdk import McpServer

if TYPE_CHECKING:
    from atmosphere.sandbox.mcp_client.servers import Fitted, McpServers

log = logging.getLogger("atmosphere.sandbox")


def mcp_sdk_installed() -> bool:
    """Whether the MCP SDK (the `mcp` extra) can be imported here."""
    return importlib.util.find_spec("mcp") is not None and importlib.util.find_spec("mcp_types") is not None


class McpHosting:
    """The app's MCP servers in this process: what the info says of them, and their subjects."""

    def __init__(self, servers: Mapping[str, McpServer], options: SandboxOptions) -> None:
        """Host `servers` (the app's, by name) with `options`' timings and bounds."""
        self._servers = dict(servers)
        self._options = options
        self._live: McpServers | None = None

    def info(self) -> dict[str, str]:
        """Each declared server's state (empty when the app declares none)."""
        if not self._servers:
            return {}
        if self._live is not None:
            return self._live.info()
        if not mcp_sdk_installed():
            return dict.fromkeys(self._servers, sdk_missing())
        return dict.fromkeys(self._servers, "INACTIVE(not started)")

    @contextlib.asynccontextmanager
    async def serving(self, bus: Bus, *, fitted: Fitted) -> AsyncIterator[Router]:
        """List the servers and keep their listing fresh while the context lasts; yields their subjects."""
        if not self._servers or not mcp_sdk_installed():
            if self._servers:
                log.warning("the app declares MCP servers %s, but the sandbox has no MCP SDK", sorted(self._servers))
            yield Router()
            return
        from atmosphere.sandbox.mcp_client.connection import McpTimings  # noqa: PLC0415 - the optional SDK
        from atmosphere.sandbox.mcp_client.servers import McpServers, serving_mcp  # noqa: PLC0415

        options = self._options
        timings = McpTimings(connect=options.mcp_connect_timeout_seconds, listing=options.mcp_list_timeout_seconds)
        servers = McpServers(self._servers, timings=timings, max_tools=options.mcp_max_tools, fitted=fitted)
        async with serving_mcp(servers, bus, refresh=options.mcp_refresh_seconds):
            self._live = servers
            try:
                yield servers.router()
            finally:
                self._live = None
