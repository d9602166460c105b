"""A running stack for hostile-input suites: every service's real `serve()`, one per module.

The stack runs in a thread with its own event loop, so a test may block (raw sockets, a client
that trickles bytes) without stalling the server, and any test, sync or async, can use it:

    def test_x(hostile: HostileStack) -> None:          # sync: raw sockets
        ...
        hostile.check_still_serving()

    async def test_y(hostile: HostileStack) -> None:    # async: httpx, websockets
        ...
        await hostile.assert_still_serving()

The app is `tests.e2e.hostile.app:app` (agents `echo`, `slow`, `assistant`, `notes`; no harness,
so no model call nobody scripted) on a fake model provider (`hostile.script(...)`). Auth is on:
`hostile.headers` / `hostile.token` is a user who may use every agent, `hostile.other_token` one
limited to `/atmosphere/agent/echo`, `hostile.admin_token` the admin. Ingress runs with small
limits and short deadlines (`HOSTILE_INGRESS`) so that limit and slow-client cases stay cheap.
`hostile.call(coro)` runs a coroutine in the stack's loop (for its bus or services) and returns
its result.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import uuid
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import websockets

from atmosphere.bus import NatsBus, connect
from atmosphere.config import AuthOptions
from atmosphere.ingress.settings import IngressOptions, TokenGrant
from atmosphere.testing import ScriptedModel, Stack, Turn, run_stack
from atmosphere.testing.pytest_plugin import delete_namespace_streams
from tests.e2e.conftest import SERVICES, service_map

T = TypeVar("T")

USER_TOKEN = "hostile-user-token-1"
OTHER_TOKEN = "hostile-other-token-2"
ADMIN_TOKEN = "hostile-admin-token-3"
GRANTS = (
    TokenGrant(token=USER_TOKEN, user_id="mallory"),
    TokenGrant(token=OTHER_TOKEN, user_id="trudy", paths=("/atmosphere/agent/echo",)),
)
MESSAGE_LIMIT = 64 * 1024
HOSTILE_INGRESS = IngressOptions(
    port=0,
    auth_tokens=GRANTS,
    max_message_bytes=MESSAGE_LIMIT,
    max_header_bytes=16 * 1024,
    max_request_line_bytes=4 * 1024,
    first_byte_timeout=1.0,
    header_timeout=1.0,
    body_timeout=1.5,
    keep_alive_timeout=1.0,
)
STARTUP_TIMEOUT = 60.0


@dataclass
class HostileStack:
    """How a test reaches the running stack."""

    url: str
    nats_url: str
    namespace: str
    provider: ScriptedModel
    stack: Stack
    loop: asyncio.AbstractEventLoop
    token: str = USER_TOKEN
    other_token: str = OTHER_TOKEN
    admin_token: str = ADMIN_TOKEN
    message_limit: int = MESSAGE_LIMIT
    options: IngressOptions = field(default=HOSTILE_INGRESS)

    @property
    def host_port(self) -> tuple[str, int]:
        """Ingress's address, for raw sockets."""
        host, _, port = self.url.removeprefix("http://").rpartition(":")
        return host, int(port)

    @property
    def ws(self) -> str:
        """The WebSocket base URL."""
        return self.url.replace("http://", "ws://")

    @property
    def headers(self) -> dict[str, str]:
        """Credentials of the user who may use every agent."""
        return {"Authorization": f"Bearer {self.token}"}

    def script(self, *turns: Turn) -> None:
        """Replace the fake provider's script (what an earlier test left unused is dropped)."""
        self.provider.turns[:] = turns

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Run `coro` in the stack's loop (its bus, its services) and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def assert_still_serving(self) -> None:
        """Ingress is ready and completes a normal echo run over WebSocket."""
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as http:
            ready = await http.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["ready"] is True
        text = f"still serving {uuid.uuid4().hex[:6]}"
        async with websockets.connect(f"{self.ws}/atmosphere/agent/echo", additional_headers=self.headers) as ws:
            await ws.send(text)
            frames = await read_until_terminal(ws)
        assert frames[-1]["type"] == "complete", frames
        assert "".join(f["data"] for f in frames if f.get("type") == "streaming-text") == text

    def check_still_serving(self) -> None:
        """`assert_still_serving` for sync tests."""
        asyncio.run(self.assert_still_serving())


async def read_until_terminal(ws: websockets.ClientConnection, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Frames of one run through its terminal frame (error frames of ingress itself, seq 0, do not end it)."""
    frames: list[dict[str, Any]] = []
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        frames.append(frame)
        if frame.get("type") in {"complete", "error"} and frame.get("seq", 0) > 0:
            return frames


@contextlib.contextmanager
def hostile_stack(
    nats_url: str,
    data_dir: Path,
    *,
    ingress: IngressOptions = HOSTILE_INGRESS,
    names: tuple[str, ...] = tuple(SERVICES),
    ingress_settings: dict[str, Any] | None = None,
) -> Iterator[HostileStack]:
    """Start the stack (or just the services `names`) in a thread of its own; stop it on exit."""
    namespace = f"h{uuid.uuid4().hex[:12]}"
    loop = asyncio.new_event_loop()
    started: Future[HostileStack] = Future()
    stopping: asyncio.Event | None = None

    async def main() -> None:
        nonlocal stopping
        stopping = asyncio.Event()
        provider = ScriptedModel()
        try:
            # The provider serves first: dispatch's settings need its URL.
            async with provider.serving(), connect(nats_url, name="hostile", namespace=namespace) as bus:
                try:
                    await _serve(bus, provider)
                finally:
                    await delete_namespace_streams(bus, namespace)
        except BaseException as exc:
            if not started.done():
                started.set_exception(exc)
            raise

    async def _serve(bus: NatsBus, provider: ScriptedModel) -> None:
        assert stopping is not None
        services = service_map(
            nats_url,
            namespace,
            data_dir,
            names,
            app="tests.e2e.hostile.app:app",
            llm_base_url=provider.base_url,
            ingress={"ingress": ingress, "admin_token": ADMIN_TOKEN, **(ingress_settings or {})},
            # Dispatch's gRPC reads the same grants as ingress, as in a deployment.
            dispatch={"ingress": AuthOptions(auth_tokens=ingress.auth_tokens)},
        )
        async with run_stack(services, bus=bus) as stack:
            url = await stack.ingress_url()
            started.set_result(
                HostileStack(
                    url=url,
                    nats_url=nats_url,
                    namespace=namespace,
                    provider=provider,
                    stack=stack,
                    loop=loop,
                    options=ingress,
                )
            )
            await stopping.wait()

    def run() -> None:
        with contextlib.suppress(BaseException):
            loop.run_until_complete(main())
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    thread = threading.Thread(target=run, name=f"hostile-stack-{namespace}", daemon=True)
    thread.start()
    try:
        yield started.result(STARTUP_TIMEOUT)
    finally:
        if stopping is not None:
            loop.call_soon_threadsafe(stopping.set)
        thread.join(STARTUP_TIMEOUT)


@pytest.fixture(scope="module")
def hostile(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostileStack]:
    """The stack of this test module (see the module docstring)."""
    with hostile_stack(nats_url, tmp_path_factory.mktemp("hostile") / "data") as running:
        yield running
