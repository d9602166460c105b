"""Tape's wiring: record every run's events from `ATMO_EVENTS`, sweep, answer queries."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from atmosphere.bus import Bus, subjects
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.service import open_service
from atmosphere.service.replica import ReplicaPosition, StreamReplica
from atmosphere.tape.agents import AgentDirectory
from atmosphere.tape.handlers import TapeHandlers
from atmosphere.tape.recorder import Recorder
from atmosphere.tape.redact import Redactor
from atmosphere.tape.retention import Bounds, Retention
from atmosphere.tape.runstate import Limits
from atmosphere.tape.settings import TapeOptions, TapeSettings
from atmosphere.tape.store import TapeStore
from atmosphere.tape.sweep import sweep

CAUGHT_UP_TIMEOUT = 10.0
"""How long a query waits for this replica to record what the stream already holds."""
RECORD_POLL = 0.2
"""Seconds between two looks at `ATMO_EVENTS` for events to record, when no query asked."""

log = logging.getLogger("atmosphere.tape")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def describe(settings: TapeSettings) -> dict[str, Any]:
    """The tape's part of the runtime truth (`/api/console/info`): what is really configured."""
    options = settings.tape
    return {
        "tape": {
            "enabled": True,
            "store": "sqlite",
            "path": str(settings.db_path),
            "maxRuns": options.max_runs,
            "maxAge": options.max_age,
            "maxBytes": options.max_bytes,
            "maxStepsPerRun": options.max_steps_per_run,
            "maxTextChars": options.max_text_chars,
            "idleTimeout": options.idle_timeout,
            "redact": options.redact,
        }
    }


def retention_of(options: TapeOptions) -> Retention:
    """The retention `options` ask for."""
    return Retention(Bounds(options.max_runs, options.max_bytes, int(options.max_age * 1000)))


@contextlib.asynccontextmanager
async def sweeping(store: TapeStore, retention: Retention, options: TapeOptions) -> AsyncIterator[None]:
    """Sweep now and then every `sweep_interval` seconds, until exit."""

    async def loop() -> None:
        while True:
            try:
                result = await sweep(
                    store, retention, idle_timeout_ms=int(options.idle_timeout * 1000), now_ms=_now_ms()
                )
                if result.abandoned or result.expired:
                    log.info("tape sweep: %d runs abandoned, %d expired", result.abandoned, result.expired)
            except Exception:
                log.exception("tape sweep failed; retrying in %gs", options.sweep_interval)
            await asyncio.sleep(options.sweep_interval)

    task = asyncio.create_task(loop(), name="tape-sweep")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def serve(settings: TapeSettings, *, stop: asyncio.Event, bus: Bus | None = None) -> None:
    """Run the tape until `stop` is set, on `bus` when given (else on a connection to `settings.nats`)."""
    options = settings.tape
    async with (
        TapeStore.open(settings.db_path) as store,
        open_service("tape", settings, info=lambda: describe(settings), stop=stop, bus=bus) as runtime,
    ):
        retention = retention_of(options)
        await retention.load(store.db)
        recorder = Recorder(
            store,
            limits=Limits(options.max_steps_per_run, options.max_text_chars),
            redactor=Redactor(enabled=options.redact),
            retention=retention,
            directory=AgentDirectory(runtime.bus),
        )

        # Every tape replica records the whole stream by reading it, its position beside its
        # store: replicas never split the runs between them, and each answers queries alone.
        async def caught_up() -> None:  # `events` is made below: it records through `handlers`
            await events.caught_up()

        handlers = TapeHandlers(store, max_payload=runtime.bus.max_payload, recorder=recorder, caught_up=caught_up)
        events = StreamReplica(
            runtime.bus,
            stream=subjects.EVENTS_STREAM,
            filter_subject=subjects.run_events_all(),
            message_type=RunEvent,
            apply_batch=handlers.record,
            position=ReplicaPosition(settings.db_path.parent, "tape"),
            max_batch=options.max_batch,
            linger=options.batch_linger,
            # No subscription to every run's events: the tape looks this often, and a query
            # first reads whatever was stored before it (`caught_up`).
            poll_interval=RECORD_POLL,
            barrier_timeout=CAUGHT_UP_TIMEOUT,
        )
        async with (
            runtime.bus.serve(handlers.router(), queue="tape"),
            events.applying(),
            sweeping(store, retention, options),
        ):
            runtime.health.mark_ready()
            await stop.wait()
