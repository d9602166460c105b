"""Memory's wiring."""

from __future__ import annotations

import asyncio

from atmosphere.memory.handlers import runtime_info
from atmosphere.memory.settings import MemorySettings
from atmosphere.service import open_service


async def serve(settings: MemorySettings, *, stop: asyncio.Event) -> None:
    """Run memory until `stop` is set."""
    async with open_service("memory", settings, info=runtime_info) as runtime:
        runtime.health.mark_ready()
        await stop.wait()
