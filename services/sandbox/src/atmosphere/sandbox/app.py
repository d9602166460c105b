"""Sandbox's wiring: load the app, probe its own tools' backends, publish the tools, serve their subjects."""

from __future__ import annotations

import asyncio

from atmosphere.bus import Bus, subjects
from atmosphere.sandbox.builtins import sandbox_builtins
from atmosphere.sandbox.handlers import ToolHost, descriptors, runtime_info
from atmosphere.sandbox.mcp_hosting import McpHosting
from atmosphere.sandbox.settings import SandboxSettings
from atmosphere.sandbox.workers import tool_workers
from atmosphere.service import load_service_app, open_service


async def serve(settings: SandboxSettings, *, stop: asyncio.Event, bus: Bus | None = None) -> None:
    """Run sandbox until `stop` is set, on `bus` when given (else on a connection to `settings.nats`)."""
    app = load_service_app(settings.app, settings.app_dir)
    tools = app.tools
    mcp = McpHosting(app.mcp_servers, settings.sandbox)
    # Before connecting: a backend that will not start, or an app tool clashing with code_exec or
    # eval, is a start-up failure; and what the info reports is what the probes found.
    async with sandbox_builtins(settings, tools) as builtins:
        info = lambda: runtime_info(tools, builtins.info(), mcp.info())  # noqa: E731 - the fragment is rebuilt per request
        async with open_service("sandbox", settings, info=info, stop=stop, bus=bus) as runtime:
            for descriptor in descriptors(tools):
                await runtime.bus.kv_put(subjects.TOOLS_BUCKET, descriptor.name, descriptor)
            await builtins.publish(runtime.bus)
            # The workers outlive the subscriptions: on stop the bus drains the calls in flight first.
            async with tool_workers(settings, tools) as workers:
                host = ToolHost(
                    tools,
                    max_payload=runtime.bus.max_payload,
                    objects=runtime.bus,
                    max_result_bytes=settings.sandbox.max_result_bytes,
                    executor=workers,
                )
                router = host.router()
                router.include(builtins.router())
                # Sessions with the app's MCP servers: listed before ready, ended after the drain.
                async with mcp.serving(runtime.bus, fitted=host.fitted) as mcp_router:
                    router.include(mcp_router)
                    async with runtime.bus.serve(
                        router, queue="sandbox", max_inflight=settings.sandbox.max_concurrent_calls
                    ):
                        runtime.health.mark_ready()
                        await stop.wait()
