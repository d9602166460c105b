"""Ingress's wiring: the ASGI app under uvicorn, stopped by `stop`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import uvicorn

from atmosphere.ingress.api import create_app
from atmosphere.ingress.settings import IngressSettings

log = logging.getLogger("atmosphere.ingress")


class _Server(uvicorn.Server):
    # Signals belong to the process runner (`atmosphere.service.run`), not to uvicorn.
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve(settings: IngressSettings, *, stop: asyncio.Event) -> None:
    """Serve HTTP and WebSocket until `stop` is set."""
    server: _Server | None = None

    def info() -> dict[str, Any]:
        return {"ingress": {"http": _address(server, settings)}, **surfaces(settings)}

    options = settings.ingress
    config = uvicorn.Config(
        create_app(settings, info=info),
        host=options.host,
        port=options.port,
        lifespan="on",
        log_config=None,
        access_log=False,
        # Per-message deflate keeps a zlib context per socket: costly for idle connections.
        ws_per_message_deflate=False,
        ws_max_size=options.max_message_bytes,
    )
    server = _Server(config)
    serving = asyncio.create_task(server.serve())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if server.started:
        log.info("ingress stopping")
    server.should_exit = True
    stopping.cancel()
    await serving
    if not server.started:
        msg = "ingress failed to start (see the log above)"
        raise RuntimeError(msg)


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
    if settings.ingress.auth_tokens:
        blocks["auth"] = {"kind": "bearer", "grants": len(settings.ingress.auth_tokens)}
    if settings.ingress.cors_origins:
        blocks["cors"] = list(settings.ingress.cors_origins)
    admin_open = settings.admin_token or not settings.admin_http_read_auth_required
    if admin_open:
        blocks["hasAdmin"] = True
    return blocks


def _address(server: uvicorn.Server | None, settings: IngressSettings) -> str:
    if server is not None:
        for listener in getattr(server, "servers", []):
            for sock in listener.sockets:
                host, port = sock.getsockname()[:2]
                return f"http://{host}:{port}"
    return f"http://{settings.ingress.host}:{settings.ingress.port}"
