"""Ingress's wiring: the ASGI app under uvicorn, stopped by `stop`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI

from atmosphere.bus import Bus, ConnectionLostError
from atmosphere.ingress.access_log import quiet_uvicorn
from atmosphere.ingress.api import create_app
from atmosphere.ingress.limits import HttpLimits, bounded_protocol
from atmosphere.ingress.pacing import Drain
from atmosphere.ingress.protocol_doors import door_surfaces
from atmosphere.ingress.settings import IngressSettings
from atmosphere.ingress.socket_protocol import LeanSocketProtocol

log = logging.getLogger("atmosphere.ingress")

SHUTDOWN_ROOM = 2
"""Seconds of the drain grace kept for the lifespan's shutdown after connections are cut."""
LAST_WORDS = 0.5
"""Seconds a server past its grace gets to finish on its own before it is cancelled."""


class _Server(uvicorn.Server):
    # Signals belong to the process runner (`atmosphere.service.run`), not to uvicorn.
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve(settings: IngressSettings, *, stop: asyncio.Event, bus: Bus | None = None) -> None:
    """Serve HTTP and WebSocket until `stop` is set.

    `bus` replaces the connection to NATS (a test's `FakeBus`); the caller closes it. The port
    may be 0: the one bound is in the service info (`ingress.http`).
    """
    server: _Server | None = None

    def info() -> dict[str, Any]:
        return {"ingress": {"http": _address(server, settings)}, **surfaces(settings)}

    options = settings.ingress
    quiet_uvicorn()  # its WebSocket lines would show a query string's token; ours do not
    drain = Drain()
    app = create_app(settings, info=info, stop=stop, drain=drain, bus=bus)
    config = uvicorn.Config(
        app,
        host=options.host,
        port=options.port,
        lifespan="on",
        log_config=None,
        access_log=False,
        # httptools (llhttp, in C), bounded (`limits.py`): head sizes, deadlines, a connection
        # cap, JSON refusals.
        http=bounded_protocol(http_limits(settings)),
        timeout_keep_alive=max(1, round(options.keep_alive_timeout)),  # the protocol keeps the exact value
        ws=LeanSocketProtocol,  # uvicorn's sans-I/O protocol, holding less per open socket
        # Per-message deflate keeps a zlib context per socket: costly for idle connections.
        ws_per_message_deflate=False,
        # Pings keep proxies from cutting a quiet socket and find a vanished client; an idle
        # one (no run, no message) is closed by its connection (`ws_idle_timeout`).
        ws_ping_interval=options.ws_ping_interval,
        ws_ping_timeout=options.ws_ping_timeout,
        # Messages up to twice the limit are still read and refused with an error frame (the
        # socket stays open); beyond that the protocol closes the socket with 1009.
        ws_max_size=2 * options.max_message_bytes,
        # Streams are ended by the drain at once; a connection still open this long is cut,
        # leaving the rest of the grace for the lifespan's own shutdown (closing the bus).
        timeout_graceful_shutdown=max(1, int(options.drain_grace) - SHUTDOWN_ROOM),
    )
    server = _Server(config)
    serving = asyncio.create_task(server.serve())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if server.started:
        await _pre_stop(app, serving, options.pre_stop_delay)
        log.info("ingress stopping: draining open streams (grace %.0f s)", options.drain_grace)
        _stop_listening(server)
        drain.start()
    server.should_exit = True
    await _within_grace(server, serving, options.drain_grace)
    if not server.started:
        msg = "ingress failed to start (see the log above)"
        raise RuntimeError(msg)
    state = getattr(app.state, "ingress", None)
    if state is not None and state.bus.lost:
        # The lifespan already logged it; exit non-zero so that the supervisor starts afresh.
        msg = "ingress: the NATS connection closed for good"
        raise ConnectionLostError(msg)


async def _pre_stop(app: FastAPI, serving: asyncio.Task[None], delay: float) -> None:
    """Go on serving for `delay` seconds, reporting not ready, before the listener closes.

    An orchestrator signals a stopping replica and takes it out of its endpoints at the same
    time, and proxies hear of the removal a little later: until then they still send new
    clients here, whom a listener closed at once would refuse. Nothing waits when the bus is
    gone for good (nothing could be served) or the server already ended.
    """
    state = getattr(app.state, "ingress", None)
    if delay <= 0 or state is None or state.bus.lost:
        return
    state.runtime.health.mark_not_ready()
    log.info("ingress stopping: not ready, still accepting for %.1f s (pre-stop delay)", delay)
    await asyncio.wait({serving}, timeout=delay)


def _stop_listening(server: uvicorn.Server) -> None:
    """Refuse new connections from now on: a stopping replica takes no new clients."""
    for listener in getattr(server, "servers", []):
        listener.close()


async def _within_grace(server: uvicorn.Server, serving: asyncio.Task[None], grace: float) -> None:
    """Wait for the server to stop; past `grace` seconds, cut whatever is still open.

    Drained streams end at once, so this normally takes a moment; the bound is what keeps a
    rolling update inside the orchestrator's own grace (Kubernetes kills after 30 s).
    """
    try:
        await asyncio.wait_for(asyncio.shield(serving), grace - LAST_WORDS)
    except TimeoutError:
        log.warning("ingress still busy after %.0f s of draining: exiting anyway", grace)
        server.force_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(serving), LAST_WORDS)
        except TimeoutError:
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving


def http_limits(settings: IngressSettings) -> HttpLimits:
    """The HTTP server bounds from the settings."""
    options = settings.ingress
    return HttpLimits(
        max_header_bytes=options.max_header_bytes,
        max_request_line_bytes=min(options.max_request_line_bytes, options.max_header_bytes),
        first_byte_timeout=options.first_byte_timeout,
        header_timeout=options.header_timeout,
        body_timeout=options.body_timeout,
        keep_alive_timeout=options.keep_alive_timeout,
        max_connections=options.max_connections,
    )


def surfaces(settings: IngressSettings) -> dict[str, Any]:
    """The console-info blocks of what this ingress really serves (absent when off)."""
    blocks: dict[str, Any] = {"transport": ["websocket", "sse", "long-polling"]}
    if settings.ai_openai_enabled:
        blocks["openAiCompatible"] = {
            "path": "/atmosphere/v1",
            "apiKeyRequired": bool(settings.ai_openai_api_key),
            "models": sorted(settings.ai_openai_models) or "agent names",
            **({"defaultAgent": settings.ai_openai_default_agent} if settings.ai_openai_default_agent else {}),
        }
    blocks.update(door_surfaces(settings))
    if settings.ingress.auth_tokens:
        blocks["auth"] = {"kind": "bearer", "grants": len(settings.ingress.auth_tokens)}
    if settings.ingress.cors_origins:
        blocks["cors"] = list(settings.ingress.cors_origins)
    admin_open = settings.admin_token or not settings.admin_http_read_auth_required
    if admin_open:
        blocks["hasAdmin"] = True
    return blocks


def _address(server: uvicorn.Server | None, settings: IngressSettings) -> str:
    """Where ingress listens: the bound socket's address; empty while an ephemeral port is not bound yet.

    Its info answers from the start of the lifespan, before uvicorn binds: `:0` then would be an
    address nobody can reach.
    """
    if server is not None:
        for listener in getattr(server, "servers", []):
            for sock in listener.sockets:
                host, port = sock.getsockname()[:2]
                return f"http://{host}:{port}"
    if settings.ingress.port == 0:
        return ""
    return f"http://{settings.ingress.host}:{settings.ingress.port}"
