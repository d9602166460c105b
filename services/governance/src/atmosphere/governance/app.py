"""Governance's wiring."""

from __future__ import annotations

import asyncio

from atmosphere.governance.handlers import runtime_info
from atmosphere.governance.settings import GovernanceSettings
from atmosphere.service import open_service


async def serve(settings: GovernanceSettings, *, stop: asyncio.Event) -> None:
    """Run governance until `stop` is set."""
    async with open_service("governance", settings, info=runtime_info) as runtime:
        runtime.health.mark_ready()
        await stop.wait()
