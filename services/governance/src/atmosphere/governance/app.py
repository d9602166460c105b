"""Governance's wiring: the decision log and the responders."""

from __future__ import annotations

import asyncio
import logging

from atmosphere.bus import Bus
from atmosphere.governance.handlers import GovernanceHandlers, MemorySafety, runtime_info
from atmosphere.governance.injection import Breach
from atmosphere.governance.plane import load_ring
from atmosphere.governance.settings import GovernanceSettings
from atmosphere.governance.store import DecisionLog
from atmosphere.service import open_service

log = logging.getLogger("atmosphere.governance")


async def serve(settings: GovernanceSettings, *, stop: asyncio.Event, bus: Bus | None = None) -> None:
    """Run governance until `stop` is set, on `bus` when given (else on a connection to `settings.nats`)."""
    if settings.ai_memory_safety_tier.strip().upper() != "RULE_BASED":
        log.warning("memory safety tier %s is not available here: using RULE_BASED", settings.ai_memory_safety_tier)
    safety = MemorySafety(
        enabled=settings.ai_memory_safety_enabled,
        breach=Breach(settings.ai_memory_safety_on_breach),
        fail_open=settings.ai_memory_safety_fail_open,
    )
    # Before anything is served: a policy file that does not parse stops governance (fail-closed).
    ring = load_ring(settings.app_dir, settings.governance.policy_files)
    async with (
        DecisionLog.open(settings.db_path) as decisions,
        open_service("governance", settings, info=lambda: runtime_info(safety, ring), stop=stop, bus=bus) as runtime,
        runtime.bus.serve(
            GovernanceHandlers(decisions, safety, ring=ring, max_payload=runtime.bus.max_payload).router(),
            queue="governance",
        ),
    ):
        runtime.health.mark_ready()
        await stop.wait()
