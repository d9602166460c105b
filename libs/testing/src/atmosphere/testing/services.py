"""Running a service's real `serve()` inside a test, and waiting for conditions."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
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


@contextlib.asynccontextmanager
async def running_service(
    name: str,
    serve: Callable[..., Coroutine[Any, Any, None]],
    settings: Any,
    *,
    bus: Bus,
    timeout: float = 15.0,
) -> AsyncIterator[asyncio.Task[None]]:
    """Run `serve(settings, stop=...)` as a task until the service reports ready over NATS.

    On exit the service is stopped through its `stop` event and must end within `timeout`.
    """
    stop = asyncio.Event()
    task = asyncio.create_task(serve(settings, stop=stop), name=f"service-{name}")

    async def ready() -> bool:
        if task.done():
            task.result()  # raises the service's own error
            msg = f"{name} exited before becoming ready"
            raise RuntimeError(msg)
        try:
            health = await bus.request(
                subjects.service_health(name), HealthCheckRequest(), HealthCheckResponse, timeout=0.5
            )
        except BusError:
            return False
        return health.ready

    try:
        await wait_until(ready, timeout=timeout, what=f"{name} to be ready")
        yield task
    finally:
        stop.set()
        try:
            await asyncio.wait_for(task, timeout)
        except TimeoutError:
            task.cancel()
            raise


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
