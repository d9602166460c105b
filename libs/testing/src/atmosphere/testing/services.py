"""Running a service's real `serve()` inside a test, and waiting for conditions."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

import nats
import nats.aio.client

from atmosphere.bus import Bus, BusError, subjects
from atmosphere.bus.permissions import Credential, inbox_prefix
from atmosphere.contracts.common.v1.service_pb2 import HealthCheckRequest, HealthCheckResponse


async def wait_until(
    condition: Callable[[], Awaitable[bool]], *, timeout: float = 10.0, interval: float = 0.05, what: str = ""
) -> None:
    """Poll `condition` until it is true; `TimeoutError` naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        if await condition():
            return
        if time.monotonic() >= deadline:
            msg = f"timed out after {timeout:g}s waiting for {what or condition!r}"
            raise TimeoutError(msg)
        await asyncio.sleep(interval)


START_TIMEOUT = 60.0
"""How long a service may take to report ready. Generous on purpose: it is a deadline for a start
that hangs, never a measure of speed, and sandbox's start spawns tool workers that import the app,
which a loaded two-core CI machine has been seen to take more than 15 s over."""

Serve = Callable[..., Coroutine[Any, Any, None]]
"""A service's `serve(settings, *, stop)` (its other arguments bound)."""


@dataclass(frozen=True)
class _Launched:
    """A service's `serve()` running as a task, and the event that stops it."""

    name: str
    task: asyncio.Task[None]
    stop: asyncio.Event

    @classmethod
    def start(cls, name: str, serve: Serve, settings: Any) -> _Launched:
        stop = asyncio.Event()
        return cls(name, asyncio.create_task(serve(settings, stop=stop), name=f"service-{name}"), stop)

    async def ready(self, bus: Bus) -> bool:
        """Whether the service says it is ready over the bus; its own error if it ended."""
        if self.task.done():
            self.task.result()  # raises the service's own error
            msg = f"{self.name} exited before becoming ready"
            raise RuntimeError(msg)
        try:
            health = await bus.request(
                subjects.service_health(self.name), HealthCheckRequest(), HealthCheckResponse, timeout=0.5
            )
        except BusError:
            return False
        return health.ready

    async def stopped(self, timeout: float) -> None:
        """Set `stop` and wait for the service to end, at most `timeout` seconds (then it is cancelled)."""
        self.stop.set()
        try:
            await asyncio.wait_for(self.task, timeout)
        except TimeoutError:
            self.task.cancel()
            raise


@contextlib.asynccontextmanager
async def running_service(
    name: str,
    serve: Serve,
    settings: Any,
    *,
    bus: Bus,
    timeout: float = 15.0,
    start_timeout: float = START_TIMEOUT,
) -> AsyncIterator[asyncio.Task[None]]:
    """Run `serve(settings, stop=...)` as a task until the service reports ready over NATS.

    It must be ready within `start_timeout`; on exit it is stopped through its `stop` event and
    must end within `timeout`.
    """
    async with running_services(
        {name: (serve, settings)}, bus=bus, timeout=timeout, start_timeout=start_timeout
    ) as tasks:
        yield tasks[name]


@contextlib.asynccontextmanager
async def running_services(
    services: Mapping[str, tuple[Serve, Any]],
    *,
    bus: Bus,
    timeout: float = 15.0,
    start_timeout: float = START_TIMEOUT,
) -> AsyncIterator[dict[str, asyncio.Task[None]]]:
    """Start `services` (name → (serve, settings)) all at once; yield once each reports ready.

    They start side by side (a slow one, such as sandbox starting its tool workers, costs its own
    time only) and must each be ready within `start_timeout`; on exit they are stopped in reverse
    order, each within `timeout`.
    """
    launched: list[_Launched] = []
    try:
        launched.extend(_Launched.start(name, serve, settings) for name, (serve, settings) in services.items())
        waits = [
            asyncio.create_task(
                wait_until(functools.partial(s.ready, bus), timeout=start_timeout, what=f"{s.name} to be ready")
            )
            for s in launched
        ]
        try:
            await asyncio.gather(*waits)  # the first failure as itself (a service's own error)
        finally:
            for wait in waits:
                wait.cancel()  # the others' waits, once one failed
        yield {s.name: s.task for s in launched}
    finally:
        # Every service is stopped even when one fails to: the first failure is raised after.
        ended = [await _outcome(service.stopped(timeout)) for service in reversed(launched)]
        failed = [error for error in ended if error is not None]
        if failed:
            raise failed[0]


async def _outcome(stopping: Awaitable[None]) -> BaseException | None:
    """None once `stopping` is done, else what it raised."""
    try:
        await stopping
    except Exception as exc:  # the service's own error, or its stop timing out
        return exc
    return None


@contextlib.asynccontextmanager
async def raw_login(url: str, credential: Credential, errors: list[str]) -> AsyncIterator[nats.aio.client.Client]:
    """A plain nats-py client logged in as `credential`, as a probe of its permissions.

    It uses the role's own inbox prefix (what the role may subscribe to), never reconnects, and
    appends each error the server reports (a permissions violation) to `errors`.
    """

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    client = await nats.connect(
        url,
        user=credential.user,
        password=credential.password,
        inbox_prefix=inbox_prefix(credential.user),
        error_cb=on_error,
        allow_reconnect=False,
    )
    try:
        yield client
    finally:
        await client.close()
