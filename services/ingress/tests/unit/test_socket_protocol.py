"""What an open WebSocket holds, and how sockets are routed: ingress's real `serve()` on a `FakeBus`.

An open socket keeps no handshake (no headers, so no token, in uvicorn's or websockets' objects)
and lean queues (`socket_protocol.py`); every WebSocket goes to `SocketDoors`, by agent name
under `/atmosphere/agent/` or by `@ai_endpoint` path anywhere else.
"""

from __future__ import annotations

import gc
import json

import websockets
from websockets.datastructures import Headers

from atmosphere.bus import subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.config import TokenGrant
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.ingress.mailbox import Flag, Mailbox
from atmosphere.ingress.socket_protocol import LeanSocketProtocol
from atmosphere.testing import wait_until

from .test_stream_limits import ADA, ADA_RUN, BOB, bearer, next_frame, running_ingress, submissions

BOT = AgentDescriptor(name="bot", path="/my/bot")
ADA_HERE = TokenGrant(token="ada-token-only-in-this-test", user_id="ada")
"""Ada, with a token no other test sends: headers still holding it are this test's."""


async def submitted(bus: FakeBus, count: int) -> None:
    async def enough() -> bool:
        return len(submissions(bus)) >= count

    await wait_until(enough, what=f"{count} submission(s)")


def _server_protocols() -> list[LeanSocketProtocol]:
    return [o for o in gc.get_objects() if isinstance(o, LeanSocketProtocol)]


async def test_an_open_socket_keeps_no_handshake_and_lean_queues() -> None:
    async with (
        running_ingress(grants=(ADA_HERE,)) as ingress,
        ingress.socket(ADA_HERE, **{"X-Atmosphere-Run-Id": ADA_RUN}) as ws,
    ):
        assert (await next_frame(ws))["seq"] == 1  # open and streaming
        [protocol] = _server_protocols()
        assert (protocol.request, protocol.response) == (None, None)
        assert isinstance(protocol.queue, Mailbox)
        assert isinstance(protocol.writable, Flag)
        assert protocol.writable.is_set()
        # The client's own handshake objects live in this process too; any other headers holding
        # the token would be the server's, kept for the life of the socket.
        clients = {id(ws.request.headers), id(ws.response.headers)}
        gc.collect()
        kept = [
            h
            for h in gc.get_objects()
            if isinstance(h, Headers) and id(h) not in clients and ADA_HERE.token in str(h.get("Authorization"))
        ]
        assert kept == []

        await ws.send("still served")  # and the socket still takes prompts
        await submitted(ingress.bus, 1)
        assert [s.message for s in submissions(ingress.bus)] == ["still served"]


async def test_sockets_are_routed_by_agent_name_and_by_endpoint_path() -> None:
    async with running_ingress() as ingress:
        await ingress.bus.kv_put(subjects.AGENTS_BUCKET, BOT.name, BOT)
        base = ingress.url.replace("http://", "ws://")

        async with websockets.connect(f"{base}/my/bot", additional_headers=bearer(BOB), ping_interval=None) as bot:
            await bot.send("to the endpoint")
        async with ingress.socket(BOB) as echo:
            await echo.send("to echo by name")
        await submitted(ingress.bus, 2)
        assert [(s.agent, s.message) for s in submissions(ingress.bus)] == [
            ("bot", "to the endpoint"),
            ("echo", "to echo by name"),
        ]

        # Under the agents' prefix, anything but one path segment is an endpoint path: none is there.
        for path, shown in (("/atmosphere/agent/echo/extra", "extra"), ("/atmosphere/agent/", "")):
            async with websockets.connect(f"{base}{path}", additional_headers=bearer(BOB), ping_interval=None) as ws:
                await ws.wait_closed()
            assert (ws.close_code, ws.close_reason) == (4404, f"Unknown agent '{shown}'")

        # An HTTP request on an agent's path still goes to its route (no socket door there).
        polled = await ingress.http.get(f"/atmosphere/runs/{ADA_RUN}/poll", params={"wait": 0}, headers=bearer(ADA))
        assert polled.status_code == 200
        assert json.loads(polled.text)


async def test_a_socket_without_credentials_learns_nothing_of_the_agents() -> None:
    async with running_ingress() as ingress:
        base = ingress.url.replace("http://", "ws://")
        for path in ("/atmosphere/agent/echo", "/atmosphere/agent/nobody", "/my/nothing"):
            async with websockets.connect(f"{base}{path}", ping_interval=None) as ws:
                await ws.wait_closed()
            assert ws.close_code == 4401, path


async def test_the_largest_messages_pass_through_the_lean_protocol() -> None:
    # The limit (1 KiB here) is taken; up to twice it is read and answered with an error frame on
    # a socket that stays open; beyond that uvicorn's protocol closes with 1009.
    limit = 1024
    async with running_ingress(max_message_bytes=limit) as ingress, ingress.socket(BOB) as ws:
        await ws.send("x" * limit)
        await submitted(ingress.bus, 1)
        await ws.send("é" * limit)  # 2 KiB of UTF-8: twice the limit
        while (frame := await next_frame(ws))["type"] != "error":
            pass  # the first prompt's run says it started
        assert frame["code"] == "ingress.too_large"
        await ws.send("x" * (2 * limit + 1))
        await ws.wait_closed()
    assert ws.close_code == 1009
    assert [len(s.message) for s in submissions(ingress.bus)] == [limit]
