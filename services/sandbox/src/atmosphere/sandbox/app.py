"""Sandbox's wiring."""

from __future__ import annotations

import asyncio

from atmosphere.sandbox.handlers import runtime_info
from atmosphere.sandbox.settings import SandboxSettings
from atmosphere.service import open_service


async def serve(settings: SandboxSettings, *, stop: asyncio.Event) -> None:
    """Run sandbox until `stop` is set."""
    async with open_service("sandbox", settings, info=runtime_info) as runtime:
        runtime.health.mark_ready()
        await stop.wait()
