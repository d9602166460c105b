"""`/healthz`, `/readyz` and `/metrics` over plain HTTP for Kubernetes probes and Prometheus.

A dozen lines of asyncio instead of a web framework: the probes must answer even when the
service is busy, cost nothing when idle, and accept nothing but a bounded GET.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from http import HTTPStatus

from atmosphere.service._health import Health
from atmosphere.service.telemetry import metrics

_MAX_HEADER_LINES = 64
_READ_TIMEOUT = 5.0


def _response(
    status: HTTPStatus, body: dict[str, object] | bytes, *, head: bool = False, content_type: str = "application/json"
) -> bytes:
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    lines = [
        f"HTTP/1.1 {status.value} {status.phrase}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(payload)}",
        "Connection: close",
        "",
        "",
    ]
    return "\r\n".join(lines).encode() + (b"" if head else payload)


def probe_response(health: Health, method: str, path: str) -> bytes:
    """The HTTP response to one probe request."""
    if method not in {"GET", "HEAD"}:
        return _response(HTTPStatus.METHOD_NOT_ALLOWED, {"error": "only GET and HEAD are allowed"})
    head = method == "HEAD"
    route = path.split("?", 1)[0]
    if route == "/healthz":
        if not health.live:
            body: dict[str, object] = {
                "status": "failed",
                "service": health.service,
                "reason": "the NATS connection closed for good",
            }
            return _response(HTTPStatus.SERVICE_UNAVAILABLE, body, head=head)
        return _response(HTTPStatus.OK, {"status": "ok", "service": health.service}, head=head)
    if route == "/readyz":
        ready = health.ready
        status = HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE
        # The instance (host:pid) lets a supervisor tell its own child's answer from another
        # process that happens to hold the port (`atmosphere dev` counts only its own).
        body = {"ready": ready, "service": health.service, "instance": health.instance}
        return _response(status, body, head=head)
    if route == "/metrics":
        # The probe port is the cluster-internal one: a scrape needs no token (ingress's, public, does).
        return _response(HTTPStatus.OK, metrics.render(), head=head, content_type=metrics.CONTENT_TYPE)
    return _response(HTTPStatus.NOT_FOUND, {"error": f"no route {route}"}, head=head)


async def _handle(health: Health, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        request_line = await asyncio.wait_for(reader.readline(), _READ_TIMEOUT)
        for _ in range(_MAX_HEADER_LINES):
            line = await asyncio.wait_for(reader.readline(), _READ_TIMEOUT)
            if line in {b"\r\n", b"\n", b""}:
                break
        parts = request_line.decode("latin-1").split()
        if len(parts) != 3:
            writer.write(_response(HTTPStatus.BAD_REQUEST, {"error": "malformed request line"}))
        else:
            writer.write(probe_response(health, parts[0], parts[1]))
        await writer.drain()
    except (TimeoutError, ConnectionError, asyncio.LimitOverrunError, ValueError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


@contextlib.asynccontextmanager
async def serve_probes(health: Health, *, host: str, port: int) -> AsyncIterator[int]:
    """Answer probes on `host:port` while the context is open; yields the bound port."""
    open_connections: dict[asyncio.StreamWriter, asyncio.Task[None]] = {}

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        open_connections[writer] = task
        try:
            await _handle(health, reader, writer)
        finally:
            open_connections.pop(writer, None)

    server = await asyncio.start_server(on_connect, host, port, limit=16384)
    try:
        bound = server.sockets[0].getsockname()[1]
        yield int(bound)
    finally:
        server.close()
        # Abort lingering clients so their handlers end on their own (EOF), not by cancellation.
        for writer in list(open_connections):
            writer.transport.abort()
        await asyncio.gather(*open_connections.values(), return_exceptions=True)
        await server.wait_closed()
