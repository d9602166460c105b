"""Tape's wiring: record every run's events from `ATMO_EVENTS`, answer queries."""

from __future__ import annotations

import asyncio
from typing import Any

from atmosphere.bus import Bus, ConsumerSpec, subjects
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.service import open_service
from atmosphere.tape.handlers import TapeHandlers
from atmosphere.tape.settings import TapeSettings
from atmosphere.tape.store import TapeStore

RECORDER = "tape"
"""The durable consumer the tape records from."""


async def serve(settings: TapeSettings, *, stop: asyncio.Event, bus: Bus | None = None) -> None:
    """Run the tape until `stop` is set, on `bus` when given (else on a connection to `settings.nats`)."""

    def info() -> dict[str, Any]:
        return {"tape": {"enabled": True, "store": "sqlite"}}

    async with (
        TapeStore.open(settings.db_path) as store,
        open_service("tape", settings, info=info, stop=stop, bus=bus) as runtime,
    ):
        handlers = TapeHandlers(store, max_payload=runtime.bus.max_payload)
        recorder = ConsumerSpec(
            stream=subjects.EVENTS_STREAM, durable=RECORDER, filter_subject=subjects.run_events_all()
        )
        async with (
            runtime.bus.serve(handlers.router(), queue="tape"),
            runtime.bus.consume_batches(
                recorder,
                RunEvent,
                handlers.record,
                max_batch=settings.tape.max_batch,
                linger=settings.tape.batch_linger,
            ),
        ):
            runtime.health.mark_ready()
            await stop.wait()
