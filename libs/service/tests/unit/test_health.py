import asyncio
import json
import os
import socket

import pytest

from atmosphere.bus import ConnectionLostError, LayoutNotProvisionedError, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.config import ServiceSettings
from atmosphere.contracts.common.v1.service_pb2 import (
    HealthCheckRequest,
    HealthCheckResponse,
    ServiceInfoRequest,
    ServiceInfoResponse,
)
from atmosphere.service import Health, health_router, run, serve_probes
from atmosphere.service._run import EXIT_NOT_PROVISIONED


async def http_get(port: int, request: bytes) -> tuple[int, dict[str, object]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    return status, json.loads(body) if body else {}


async def test_ready_needs_wiring_and_a_connection() -> None:
    bus = FakeBus()
    health = Health("tape", bus)
    assert not health.ready
    health.mark_ready()
    assert health.ready
    bus.connected = False  # type: ignore[unreachable]  # mypy narrowed `ready` by the asserts above
    assert not health.ready


async def test_health_and_info_answer_over_the_bus() -> None:
    bus = FakeBus()
    health = Health("tape", bus)
    health.mark_ready()
    async with bus.serve(health_router(health, lambda: {"tape": {"enabled": True}})):
        reply = await bus.request(subjects.service_health("tape"), HealthCheckRequest(), HealthCheckResponse)
        info = await bus.request(subjects.service_info("tape"), ServiceInfoRequest(), ServiceInfoResponse)
    assert (reply.service, reply.ready) == ("tape", True)
    assert reply.instance
    assert json.loads(info.info_json) == {"tape": {"enabled": True}}


async def test_http_probes() -> None:
    bus = FakeBus()
    health = Health("memory", bus)
    async with serve_probes(health, host="127.0.0.1", port=0) as port:
        assert await http_get(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n") == (
            200,
            {"status": "ok", "service": "memory"},
        )
        # The instance (host:pid) tells `atmosphere dev` that the answer comes from the process it started.
        instance = f"{socket.gethostname()}:{os.getpid()}"
        assert await http_get(port, b"GET /readyz HTTP/1.1\r\n\r\n") == (
            503,
            {"ready": False, "service": "memory", "instance": instance},
        )
        health.mark_ready()
        assert await http_get(port, b"GET /readyz?verbose=1 HTTP/1.1\r\n\r\n") == (
            200,
            {"ready": True, "service": "memory", "instance": instance},
        )
        assert (await http_get(port, b"POST /readyz HTTP/1.1\r\n\r\n"))[0] == 405
        assert (await http_get(port, b"GET /nope HTTP/1.1\r\n\r\n"))[0] == 404
        assert (await http_get(port, b"garbage\r\n\r\n"))[0] == 400


@pytest.mark.timeout(15)
async def test_a_silent_client_does_not_hold_the_probe_listener() -> None:
    health = Health("memory", FakeBus())
    async with serve_probes(health, host="127.0.0.1", port=0) as port:
        _, silent = await asyncio.open_connection("127.0.0.1", port)
        try:
            assert (await http_get(port, b"GET /healthz HTTP/1.1\r\n\r\n"))[0] == 200
        finally:
            silent.close()
            await silent.wait_closed()


async def test_a_connection_closed_for_good_fails_liveness_and_readiness() -> None:
    bus = FakeBus()
    health = Health("memory", bus)
    health.mark_ready()
    async with serve_probes(health, host="127.0.0.1", port=0) as port:
        bus.close_for_good()
        status, body = await http_get(port, b"GET /healthz HTTP/1.1\r\n\r\n")
        assert (status, body["status"]) == (503, "failed")
        assert (await http_get(port, b"GET /readyz HTTP/1.1\r\n\r\n"))[0] == 503


def test_the_process_exits_3_when_the_connection_closed_for_good() -> None:
    async def serve(_settings: ServiceSettings, *, stop: asyncio.Event) -> None:
        raise ConnectionLostError("closed for good")

    assert run(serve, ServiceSettings, service="memory") == 3


def test_a_service_that_finds_no_layout_exits_5_naming_what_is_missing(capsys: pytest.CaptureFixture[str]) -> None:
    async def serve(_settings: ServiceSettings, *, stop: asyncio.Event) -> None:
        raise LayoutNotProvisionedError("the JetStream layout is not provisioned: bucket ATMO_TOOLS does not exist")

    assert run(serve, ServiceSettings, service="sandbox") == EXIT_NOT_PROVISIONED == 5
    logged = capsys.readouterr().err
    assert "sandbox: the JetStream layout is not provisioned: bucket ATMO_TOOLS does not exist" in logged
    assert "Traceback" not in logged
