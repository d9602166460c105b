"""Sandbox's wiring: load the app, publish its tools, serve their subjects."""

from __future__ import annotations

import asyncio

from atmosphere.bus import Bus, subjects
from atmosphere.sandbox.handlers import ToolHost, descriptors, runtime_info
from atmosphere.sandbox.settings import SandboxSettings
from atmosphere.sandbox.workers import tool_workers
from atmosphere.service import load_service_app, open_service


async def serve(settings: SandboxSettings, *, stop: asyncio.Event, bus: Bus | None = None) -> None:
    """Run sandbox until `stop` is set, on `bus` when given (else on a connection to `settings.nats`)."""
    tools = load_service_app(settings.app, settings.app_dir).tools
    async with open_service("sandbox", settings, info=lambda: runtime_info(tools), stop=stop, bus=bus) as runtime:
        for descriptor in descriptors(tools):
            await runtime.bus.kv_put(subjects.TOOLS_BUCKET, descriptor.name, descriptor)
        # The workers outlive the subscriptions: on stop the bus drains the calls in flight first.
        async with tool_workers(settings, tools) as workers:
            host = ToolHost(
                tools,
                max_payload=runtime.bus.max_payload,
                objects=runtime.bus,
                max_result_bytes=settings.sandbox.max_result_bytes,
                executor=workers,
            )
            async with runtime.bus.serve(
                host.router(), queue="sandbox", max_inflight=settings.sandbox.max_concurrent_calls
            ):
                runtime.health.mark_ready()
                await stop.wait()
