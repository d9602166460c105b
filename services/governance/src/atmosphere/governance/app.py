"""Governance's wiring: the decision log and the responders."""

from __future__ import annotations

import asyncio

from atmosphere.governance.handlers import GovernanceHandlers, runtime_info
from atmosphere.governance.settings import GovernanceSettings
from atmosphere.governance.store import DecisionLog
from atmosphere.service import open_service


async def serve(settings: GovernanceSettings, *, stop: asyncio.Event) -> None:
    """Run governance until `stop` is set."""
    async with (
        DecisionLog.open(settings.db_path) as log,
        open_service("governance", settings, info=runtime_info) as runtime,
        runtime.bus.serve(GovernanceHandlers(log).router(), queue="governance"),
    ):
        runtime.health.mark_ready()
        await stop.wait()
