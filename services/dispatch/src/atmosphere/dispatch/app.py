"""Dispatch's wiring: load the app, publish its agents, pull runs from `ATMO_RUNS`."""

from __future__ import annotations

import asyncio
from typing import Any

from atmosphere.bus import ConsumerSpec, subjects
from atmosphere.contracts.run.v1.run_pb2 import RunRequest
from atmosphere.dispatch.handlers import RunExecutor, agent_descriptors
from atmosphere.dispatch.settings import DispatchSettings
from atmosphere.sdk import load_app
from atmosphere.service import open_service

WORKERS = "dispatch"
"""The durable consumer every dispatch instance pulls runs from."""


async def serve(settings: DispatchSettings, *, stop: asyncio.Event) -> None:
    """Run dispatch until `stop` is set."""
    app = load_app(settings.app, app_dir=settings.app_dir)
    descriptors = agent_descriptors(app)

    def info() -> dict[str, Any]:
        return {"agents": [d.name for d in descriptors], "app": settings.app}

    async with open_service("dispatch", settings, info=info) as runtime:
        bus = runtime.bus
        for descriptor in descriptors:
            await bus.kv_put(subjects.AGENTS_BUCKET, descriptor.name, descriptor)
        executor = RunExecutor(app, bus)
        consumer = ConsumerSpec(
            stream=subjects.RUNS_STREAM,
            durable=WORKERS,
            filter_subject=subjects.run_submit_all(),
            ack_wait_seconds=settings.dispatch.run_ack_wait,
        )
        async with bus.consume(
            consumer, RunRequest, executor.on_work, max_inflight=settings.dispatch.max_concurrent_runs
        ):
            runtime.health.mark_ready()
            await stop.wait()
