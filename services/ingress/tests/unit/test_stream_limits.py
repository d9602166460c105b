"""Run streams per client and in total, idle WebSockets, pings: ingress's real `serve()` on a `FakeBus`.

Two users with their own tokens: ada resumes her live run until her share is used up (429 with
`Retry-After`, or an error frame), while bob's new run still streams; every stream gives its
slot back however it ends (a client that vanishes mid-resume included).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import websockets
from starlette.websockets import WebSocket
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from atmosphere.bus import subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.config import TokenGrant
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.run.v1.run_pb2 import Metadata, RunEvent, RunSubmission
from atmosphere.ingress.app import serve
from atmosphere.ingress.connection import Connection
from atmosphere.ingress.settings import IngressOptions, IngressSettings
from atmosphere.testing import wait_until

from .test_wiring import bound_url

ECHO = AgentDescriptor(name="echo", path="/atmosphere/agent/echo")
ADA = TokenGrant(token="ada-token-0001", user_id="ada")
BOB = TokenGrant(token="bob-token-0001", user_id="bob")
ADA_RUN = "ada-live-run"
BOB_RUN = "bob-live-run"
TOO_MANY = "ingress.too_many_streams"


def bearer(grant: TokenGrant) -> dict[str, str]:
    return {"Authorization": f"Bearer {grant.token}"}


@contextlib.asynccontextmanager
async def running_ingress(*, grants: tuple[TokenGrant, ...] = (ADA, BOB), **options: Any) -> AsyncIterator[Stack]:
    """Ingress with these options on a fresh `FakeBus`, with a live run of ada's and one of bob's."""
    bus = FakeBus()
    chosen = IngressOptions(host="127.0.0.1", port=0, drain_grace=2, auth_tokens=grants, **options)
    stop = asyncio.Event()
    task = asyncio.create_task(serve(IngressSettings(ingress=chosen), stop=stop, bus=bus))
    try:
        url = await bound_url(bus, task)
        await bus.kv_put(subjects.AGENTS_BUCKET, ECHO.name, ECHO)
        for run_id, owner in ((ADA_RUN, "ada"), (BOB_RUN, "bob")):
            started = Metadata(key="X-Atmosphere-Run-Id", value_json=json.dumps(run_id))
            await bus.js_publish(
                subjects.run_events(run_id), RunEvent(run_id=run_id, seq=1, agent="echo", owner=owner, metadata=started)
            )
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            yield Stack(bus, url, http)
    finally:
        stop.set()
        await task


class Stack:
    def __init__(self, bus: FakeBus, url: str, http: httpx.AsyncClient) -> None:
        self.bus = bus
        self.url = url
        self.http = http
        self.reading: list[AsyncIterator[bytes]] = []
        """Bodies being read: an abandoned one would be collected, and close its stream."""

    def socket(self, grant: TokenGrant | None, **headers: str) -> Any:
        auth = bearer(grant) if grant is not None else {}
        url = self.url.replace("http://", "ws://") + "/atmosphere/agent/echo"
        return websockets.connect(url, additional_headers={**auth, **headers}, ping_interval=None)

    async def resume_sse(self, stack: contextlib.AsyncExitStack, grant: TokenGrant, run_id: str) -> httpx.Response:
        """An SSE resume held open by `stack`: its first frame has arrived, or it was refused."""
        response = await stack.enter_async_context(
            self.http.stream("GET", f"/atmosphere/runs/{run_id}/events", headers=bearer(grant))
        )
        if response.status_code == 200:
            body = response.aiter_bytes()
            self.reading.append(body)
            first = await anext(body)
            assert first.startswith(b"id: 1\n"), first
        else:
            await response.aread()
        return response


async def next_frame(ws: Any) -> dict[str, Any]:
    frame: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), 10))
    return frame


def submissions(bus: FakeBus) -> list[RunSubmission]:
    return [m for s, m in bus.published if isinstance(m, RunSubmission) and s.startswith("atmo.submit.")]


async def test_a_client_beyond_its_share_is_refused_and_another_user_still_streams() -> None:
    async with running_ingress(max_streams_per_client=3) as ingress, contextlib.AsyncExitStack() as held:
        for _ in range(2):
            assert (await ingress.resume_sse(held, ADA, ADA_RUN)).status_code == 200
        ws = await held.enter_async_context(ingress.socket(ADA, **{"X-Atmosphere-Run-Id": ADA_RUN}))
        assert (await next_frame(ws))["seq"] == 1  # her third stream: the share is used up

        refused = await ingress.resume_sse(held, ADA, ADA_RUN)
        polled = await ingress.http.get(f"/atmosphere/runs/{ADA_RUN}/poll", params={"wait": 0}, headers=bearer(ADA))
        await ws.send("one more prompt")
        prompt_refused = await next_frame(ws)
        other = await held.enter_async_context(ingress.socket(ADA, **{"X-Atmosphere-Run-Id": ADA_RUN}))
        resume_refused = await next_frame(other)

        # Bob's new run streams as if ada were not there.
        bobs = await held.enter_async_context(
            ingress.http.stream("POST", "/atmosphere/agent/echo", content="hi", headers=bearer(BOB))
        )
        assert bobs.status_code == 200
        bobs_body = bobs.aiter_bytes()
        assert (await anext(bobs_body)).startswith(b"id: 1\n")

    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "5"
    assert refused.json() == {
        "error": "Too many run streams open for this client (at most 3 at once); end one or try again later",
        "code": TOO_MANY,
    }
    assert (polled.status_code, polled.json()["code"]) == (429, TOO_MANY)
    assert prompt_refused["type"] == "error"
    assert prompt_refused["code"] == TOO_MANY
    assert "runId" not in prompt_refused  # nothing started: the prompt may simply be sent again
    assert (resume_refused["code"], resume_refused["runId"]) == (TOO_MANY, ADA_RUN)
    # Only bob's run was submitted: ada's refused prompt started nothing.
    assert [s.principal.user_id for s in submissions(ingress.bus)] == ["bob"]


async def test_the_total_caps_every_client_together() -> None:
    async with running_ingress(max_streams_per_client=5, max_streams=2) as ingress, contextlib.AsyncExitStack() as held:
        for _ in range(2):
            assert (await ingress.resume_sse(held, ADA, ADA_RUN)).status_code == 200
        refused = await ingress.resume_sse(held, BOB, BOB_RUN)
    assert refused.status_code == 429
    assert refused.json()["error"] == "This server follows as many run streams as it takes (2); try again shortly"


async def test_streams_give_their_slot_back_however_they_end() -> None:
    async with running_ingress(max_streams_per_client=1) as ingress:

        async def resumable() -> bool:
            async with contextlib.AsyncExitStack() as held:
                return (await ingress.resume_sse(held, ADA, ADA_RUN)).status_code == 200

        # An SSE client that vanishes mid-resume.
        async with contextlib.AsyncExitStack() as held:
            assert (await ingress.resume_sse(held, ADA, ADA_RUN)).status_code == 200
        await wait_until(resumable, timeout=10, what="the SSE resume's slot to come back")

        # A WebSocket client whose connection drops without a close frame, mid-resume (once the
        # slot the check above took is back: the server sees that client leave a moment later).
        async with asyncio.timeout(10):
            while True:
                ws = await ingress.socket(ADA, **{"X-Atmosphere-Run-Id": ADA_RUN})
                if (await next_frame(ws))["seq"] == 1:
                    break
                await ws.close()
        ws.transport.abort()
        await wait_until(resumable, timeout=10, what="the WebSocket resume's slot to come back")

        # Long-polls one after another, and a refused resume, hold nothing afterwards.
        for _ in range(3):
            polled = await ingress.http.get(
                f"/atmosphere/runs/{ADA_RUN}/poll", params={"wait": 0.05}, headers=bearer(ADA)
            )
            assert polled.status_code == 200
        assert await resumable()


async def test_an_idle_socket_is_closed_and_a_streaming_one_is_not() -> None:
    async with running_ingress(ws_idle_timeout=0.3) as ingress:
        async with ingress.socket(ADA) as idle:
            with contextlib.suppress(websockets.ConnectionClosed):
                await asyncio.wait_for(idle.recv(), 10)
            assert idle.close_code == 1001
            assert idle.close_reason == "Idle for 0.3 s; reconnect to go on"
        async with ingress.socket(ADA, **{"X-Atmosphere-Run-Id": ADA_RUN}) as streaming:
            assert (await next_frame(streaming))["seq"] == 1
            # Its run goes on (quietly): three idle timeouts later the socket is still open.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(streaming.recv(), 1.0)
            assert streaming.close_code is None


async def test_a_client_that_does_not_answer_pings_is_let_go() -> None:
    async with running_ingress(ws_ping_interval=0.2, ws_ping_timeout=0.2) as ingress:
        host, port = ingress.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"GET /atmosphere/agent/echo HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            + f"Authorization: Bearer {ADA.token}\r\n\r\n".encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 101")
        # Never answer: the pings go unanswered, and the server hangs up.
        async with asyncio.timeout(10):
            while await reader.read(1024):
                pass
        writer.close()


def _live_per_socket_objects() -> Counter[str]:
    """How many objects of the kinds every WebSocket has are alive, by kind."""
    kinds = (Connection, WebSocket, WebSocketsSansIOProtocol, asyncio.Task)
    return Counter(type(o).__name__ for o in gc.get_objects() if isinstance(o, kinds))


async def test_a_thousand_opened_and_closed_sockets_leave_nothing_behind(caplog: pytest.LogCaptureFixture) -> None:
    # What a socket costs ingress while open (its connection, its protocol, the ASGI socket, its
    # tasks) must be let go when it closes: counted as live objects, which is exact, where bytes
    # would measure the allocator (CPython keeps its peak for reuse) and pytest's log capture.
    for logger in ("", "atmosphere", "uvicorn", "websockets"):
        caplog.set_level(logging.WARNING, logger=logger)
    async with running_ingress(grants=()) as ingress:

        async def open_and_close(count: int) -> None:
            for _ in range(count // 50):
                sockets = await asyncio.gather(*(ingress.socket(None) for _ in range(50)))
                await asyncio.gather(*(s.close() for s in sockets))

        await open_and_close(100)  # warm up: first-use caches, imports
        gc.collect()
        before = _live_per_socket_objects()
        await open_and_close(1000)

        async def let_go() -> bool:
            gc.collect()
            let_go.now = _live_per_socket_objects()  # type: ignore[attr-defined]
            return all(let_go.now[kind] <= before[kind] + 2 for kind in let_go.now)  # type: ignore[attr-defined]

        await wait_until(let_go, timeout=30, interval=0.5, what="ingress to let the closed sockets go")
        print(f"live per-socket objects after 1000 sockets: {dict(let_go.now)} (before: {dict(before)})")  # type: ignore[attr-defined]
