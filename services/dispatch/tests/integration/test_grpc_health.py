"""gRPC health follows the bus: `NOT_SERVING` while NATS is down, `SERVING` once it is back.

Dispatch runs through its real `serve()` on a real nats-server that is stopped and started
again on the same port and store.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from atmosphere.bus import Bus, connect, subjects
from atmosphere.contracts.common.v1.service_pb2 import ServiceInfoRequest, ServiceInfoResponse
from atmosphere.dispatch.app import serve
from atmosphere.dispatch.grpc_api import SERVICE_NAME
from atmosphere.dispatch.settings import DispatchOptions, DispatchSettings
from atmosphere.testing import NatsServer, running_service, settings_for, wait_until

ROOT = Path(__file__).resolve().parents[4]
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
async def grpc_address(fresh_nats: NatsServer, tmp_path: Path) -> AsyncIterator[str]:
    settings = settings_for(
        DispatchSettings,
        nats_url=fresh_nats.url,
        namespace="health",
        data_dir=tmp_path / "data",
        app="examples.echo:app",
        app_dir=ROOT,
        dispatch=DispatchOptions(grpc_host="127.0.0.1", grpc_port=0, runtime="built-in"),
    )
    async with (
        connect([fresh_nats.url], name="test", namespace="health") as bus,
        running_service("dispatch", serve, settings, bus=bus),
    ):
        yield await _grpc_address(bus)


async def _grpc_address(bus: Bus) -> str:
    reply = await bus.request(subjects.service_info("dispatch"), ServiceInfoRequest(), ServiceInfoResponse)
    return str(json.loads(reply.info_json)["grpc"])


async def test_health_is_not_serving_while_nats_is_down_and_serving_when_it_is_back(
    grpc_address: str, fresh_nats: NatsServer
) -> None:
    async with grpc.aio.insecure_channel(grpc_address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)

        def status_is(expected: int, service: str = "") -> Callable[[], Awaitable[bool]]:
            async def check() -> bool:
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                return bool(reply.status == expected)

            return check

        assert await status_is(SERVING)()
        assert await status_is(SERVING, SERVICE_NAME)()
        fresh_nats.stop()
        await wait_until(status_is(NOT_SERVING), timeout=15, what="NOT_SERVING with NATS down")
        assert await status_is(NOT_SERVING, SERVICE_NAME)()
        fresh_nats.start()
        await wait_until(status_is(SERVING), timeout=30, what="SERVING with NATS back")
        assert await status_is(SERVING, SERVICE_NAME)()


async def test_a_watch_stream_hears_the_bus_go_and_come_back(grpc_address: str, fresh_nats: NatsServer) -> None:
    async with grpc.aio.insecure_channel(grpc_address) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
        assert (await watch.read()).status == SERVING
        fresh_nats.stop()
        assert (await watch.read()).status == NOT_SERVING
        fresh_nats.start()
        assert (await watch.read()).status == SERVING
        watch.cancel()
