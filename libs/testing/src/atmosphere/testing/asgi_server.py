"""An ASGI app served on loopback for the length of a test: a fake provider, an MCP server, an A2A agent."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Literal

import uvicorn


class _QuietServer(uvicorn.Server):
    """A server that leaves the test's signal handlers alone."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


@contextlib.asynccontextmanager
async def serving_asgi(app: Any, *, port: int = 0, lifespan: Literal["on", "off"] = "off") -> AsyncIterator[int]:
    """Serve `app` on 127.0.0.1 at `port` (0: a free one) until the context exits; the port it bound.

    `lifespan="on"` runs the app's own startup (an MCP server's session manager needs it).
    """
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False, lifespan=lifespan)
    server = _QuietServer(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()  # its startup failed: say why
            await asyncio.sleep(0.01)
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        await task
