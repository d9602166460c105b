"""Ingress's real `serve()` on a `FakeBus`: uvicorn binds a port of its own, routes reach the bus."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import httpx

from atmosphere.bus import NoRespondersError, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.service_pb2 import (
    HealthCheckRequest,
    HealthCheckResponse,
    ServiceInfoRequest,
    ServiceInfoResponse,
)
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.run.v1.run_pb2 import RunSubmission
from atmosphere.ingress.app import serve
from atmosphere.ingress.settings import IngressOptions, IngressSettings

ECHO = AgentDescriptor(name="echo", path="/atmosphere/agent/echo")


async def bound_url(bus: FakeBus, task: asyncio.Task[None]) -> str:
    """Ingress's HTTP base URL once it is ready and listening (the test's own timeout bounds the wait).

    Health says ready when the lifespan is done; uvicorn binds its socket just after, and the
    service info names the port it really bound (and no address before: an ephemeral port is not known).
    """
    while True:
        if task.done():
            task.result()  # the service's own error, if it failed
            raise AssertionError("ingress ended before it was listening")
        with contextlib.suppress(NoRespondersError):
            health = await bus.request(subjects.service_health("ingress"), HealthCheckRequest(), HealthCheckResponse)
            if health.ready:
                info = await bus.request(subjects.service_info("ingress"), ServiceInfoRequest(), ServiceInfoResponse)
                url = str(json.loads(info.info_json)["ingress"]["http"])
                if url:  # empty until uvicorn binds its ephemeral port
                    return url
        await asyncio.sleep(0.01)  # uvicorn starts in its own task: let it


@contextlib.asynccontextmanager
async def running_ingress() -> AsyncIterator[tuple[FakeBus, str]]:
    """Ingress served by its real `serve()` on a fresh `FakeBus` and port 0; stopped and awaited on exit."""
    bus = FakeBus()
    settings = IngressSettings(ingress=IngressOptions(host="127.0.0.1", port=0, drain_grace=2))
    stop = asyncio.Event()
    task = asyncio.create_task(serve(settings, stop=stop, bus=bus))
    try:
        yield bus, await bound_url(bus, task)
    finally:
        stop.set()
        await task  # a clean exit: no exception


async def test_serve_binds_its_own_port_and_a_prompt_is_queued_through_the_bus() -> None:
    async with running_ingress() as (bus, url):
        await bus.kv_put(subjects.AGENTS_BUCKET, ECHO.name, ECHO)
        async with httpx.AsyncClient(base_url=url) as http:
            health = await http.get("/healthz")
            started = await http.post("/atmosphere/agent/echo/poll", content="hello")
    assert health.json() == {"status": "ok", "service": "ingress"}
    assert started.status_code == 202
    run_id = started.json()["runId"]
    queued = [m for s, m in bus.published if s == subjects.run_submit(ECHO.name) and isinstance(m, RunSubmission)]
    assert [(r.run_id, r.message, r.transport) for r in queued] == [(run_id, "hello", "long-poll")]
