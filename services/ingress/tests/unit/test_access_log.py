"""The access log: one line per request and per socket, naming its run, never a secret or a prompt.

The middleware alone, driven with raw ASGI messages (what it counts, what it leaves out), then
the real app on a `FakeBus` (the run a request starts is named by its access line and by every
line logged for it), then ingress's real `serve()` on a loopback port with token grants:
rejected tokens — in a header, an API key, a query string, a malformed request line, a
WebSocket's `access_token` — appear in no log line.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import websockets
from starlette.types import Message, Receive, Scope, Send

from atmosphere.bus import subjects
from atmosphere.bus.telemetry import RunTag, current_run
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.ingress.access_log import AccessLog, note_run
from atmosphere.ingress.app import serve
from atmosphere.ingress.settings import IngressOptions, IngressSettings
from services.ingress.tests.unit.test_resume_ownership import resume_frames
from services.ingress.tests.unit.test_routes_testclient import ECHO, GRANT, ingress, settings
from services.ingress.tests.unit.test_wiring import bound_url

ACCESS = "atmosphere.ingress.access"
CLIENTS = ("httpx", "httpcore", "websockets.client")
SECRET = "query-secret-token-123"
PROMPT = "my password is swordfish-prompt"


def quoting(caplog: pytest.LogCaptureFixture, *texts: str) -> list[str]:
    """Every record of ingress's (its message, its fields) that holds one of `texts`: none should.

    The test's own clients (httpx, websockets) log what they send; ingress's lines are the rest.
    """
    found = []
    for record in caplog.records:
        if record.name.startswith(CLIENTS):
            continue
        whole = json.dumps([record.getMessage(), record.__dict__], default=str)
        if any(text in whole for text in texts):
            found.append(whole)
    return found


def access_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == ACCESS]


def http_scope(path: str = "/atmosphere/agent/echo", query: bytes = b"", method: str = "POST") -> Scope:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "headers": [(b"authorization", f"Bearer {SECRET}".encode()), (b"content-type", b"text/plain")],
    }


async def call(app: Any, scope: Scope, inbound: list[Message]) -> list[Message]:
    sent: list[Message] = []
    queue = list(inbound)

    async def receive() -> Message:
        if queue:
            return queue.pop(0)
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


async def answering(scope: Scope, receive: Receive, send: Send) -> None:
    """Reads the body, names a run, logs a line of its own, then answers 201 in two chunks."""
    await receive()
    note_run("run-1", "echo")
    logging.getLogger("atmosphere.ingress").info("inside the request")
    await asyncio.sleep(0.02)
    await send({"type": "http.response.start", "status": 201, "headers": []})
    await send({"type": "http.response.body", "body": b"one", "more_body": True})
    await send({"type": "http.response.body", "body": b"two"})


class RunSeen(logging.Handler):
    """Keeps the run bound when each line was logged (what a service's line shows as `run=`)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, RunTag | None]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((record.getMessage(), current_run()))


async def test_one_line_per_request_with_method_path_status_duration_and_run(caplog: pytest.LogCaptureFixture) -> None:
    seen = RunSeen()
    logging.getLogger("atmosphere.ingress").addHandler(seen)
    try:
        with caplog.at_level(logging.INFO):
            body = {"type": "http.request", "body": PROMPT.encode(), "more_body": False}
            await call(AccessLog(answering), http_scope(query=f"access_token={SECRET}".encode()), [body])
    finally:
        logging.getLogger("atmosphere.ingress").removeHandler(seen)
    [line] = access_lines(caplog)
    fields = {k: getattr(line, k) for k in ("method", "path", "status", "run_id")}
    assert fields == {"method": "POST", "path": "/atmosphere/agent/echo", "status": 201, "run_id": "run-1"}
    assert line.duration_ms >= 20  # type: ignore[attr-defined]
    assert line.getMessage().startswith("POST /atmosphere/agent/echo 201 ")
    assert line.getMessage().endswith("ms")
    assert quoting(caplog, SECRET, PROMPT) == []
    # The run was bound for the request's own lines, and only while it was served.
    assert ("inside the request", RunTag("run-1", "echo")) in seen.seen
    assert [run for message, run in seen.seen if message.startswith("POST ")] == [None]
    assert current_run() is None


async def test_an_app_that_raises_is_a_500_line(caplog: pytest.LogCaptureFixture) -> None:
    async def broken(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("bug")

    with caplog.at_level(logging.INFO), pytest.raises(RuntimeError):
        await call(AccessLog(broken), http_scope(method="GET"), [])
    [line] = access_lines(caplog)
    assert (line.method, line.status) == ("GET", 500)  # type: ignore[attr-defined]


async def test_off_it_writes_nothing_but_still_scopes_the_run(caplog: pytest.LogCaptureFixture) -> None:
    bound: list[RunTag | None] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        note_run("run-2")
        bound.append(current_run())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    with caplog.at_level(logging.INFO):
        await call(AccessLog(app, enabled=False), http_scope(method="GET"), [])
    assert access_lines(caplog) == []
    assert bound == [RunTag("run-2")]
    assert current_run() is None


async def test_a_path_is_kept_encoded_and_bounded(caplog: pytest.LogCaptureFixture) -> None:
    async def ok(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    scope = http_scope(method="GET")
    scope["raw_path"] = b"/a\nb?access_token=" + SECRET.encode()
    long = http_scope("/x" * 400, method="GET")
    del long["raw_path"]
    with caplog.at_level(logging.INFO):
        await call(AccessLog(ok), scope, [])
        await call(AccessLog(ok), long, [])
    first, second = access_lines(caplog)
    assert first.path == "/a%0Ab"  # type: ignore[attr-defined]
    assert len(second.path) == 257  # type: ignore[attr-defined]


def ws_scope(path: str = "/atmosphere/agent/echo") -> Scope:
    return {
        "type": "websocket",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"access_token=" + SECRET.encode(),
    }


async def test_one_line_per_websocket_when_it_closes_naming_its_runs(caplog: pytest.LogCaptureFixture) -> None:
    async def socket(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        for run_id in ("run-a", "run-b"):
            note_run(run_id, bind=False)  # a socket streams several runs: each binds in its own task
        assert current_run() is None
        for text in ("x", "y", "z"):
            await send({"type": "websocket.send", "text": text})
        message = await receive()
        assert message["type"] == "websocket.disconnect"

    with caplog.at_level(logging.INFO):
        await call(
            AccessLog(socket),
            ws_scope(),
            [{"type": "websocket.connect"}, {"type": "websocket.disconnect", "code": 1001}],
        )
    [line] = access_lines(caplog)
    assert line.getMessage().startswith("WS /atmosphere/agent/echo 101 close=1001 ")
    assert (line.status, line.close_code, line.run_id) == (101, 1001, "run-a,run-b")  # type: ignore[attr-defined]
    assert SECRET not in line.getMessage()


async def test_a_socket_closed_before_it_was_accepted_is_a_403(caplog: pytest.LogCaptureFixture) -> None:
    async def refuse(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "websocket.close", "code": 1008})

    with caplog.at_level(logging.INFO):
        await call(AccessLog(refuse), ws_scope(), [{"type": "websocket.connect"}])
    [line] = access_lines(caplog)
    assert (line.status, getattr(line, "close_code", None)) == (403, None)  # type: ignore[attr-defined]


async def test_a_websocket_runs_lines_name_it_from_its_own_task() -> None:
    # A socket streams each run in a task of its own, bound to the run: a broken follow's line
    # (the stream is not provisioned on this bus) names it; the socket's task stays unbound.
    seen = RunSeen()
    logging.getLogger("atmosphere.ingress").addHandler(seen)
    try:
        frames, _ = await resume_frames(FakeBus(), "run-x", allowed=None)
    finally:
        logging.getLogger("atmosphere.ingress").removeHandler(seen)
    assert frames[0]["runId"] == "run-x"
    assert [run for message, run in seen.seen if message.startswith("following run run-x failed")] == [
        RunTag("run-x", "echo")
    ]
    assert current_run() is None


# -- the real app --------------------------------------------------------------------------------


async def test_the_real_app_names_the_run_a_request_started(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        async with ingress(settings(), ECHO) as http:
            started = await http.post(
                f"/atmosphere/agent/echo/poll?access_token={GRANT.token}", content=PROMPT.encode()
            )
            polled = await http.get(started.json()["next"] + "&wait=1", headers={"X-API-Key": GRANT.token})
    run_id = started.json()["runId"]
    assert polled.status_code == 200
    lines = {r.getMessage().split(" ")[1]: r for r in access_lines(caplog)}
    start = lines["/atmosphere/agent/echo/poll"]
    assert (start.method, start.status, start.run_id) == ("POST", 202, run_id)  # type: ignore[attr-defined]
    poll = lines[f"/atmosphere/runs/{run_id}/poll"]
    assert (poll.method, poll.status, poll.run_id) == ("GET", 200, run_id)  # type: ignore[attr-defined]
    assert quoting(caplog, GRANT.token, PROMPT) == []


async def test_the_access_log_can_be_turned_off(caplog: pytest.LogCaptureFixture) -> None:
    quiet = settings(ingress=IngressOptions(max_message_bytes=4096, access_log=False))
    with caplog.at_level(logging.INFO):
        async with ingress(quiet, ECHO) as http:
            assert (await http.get("/healthz")).status_code == 200
    assert access_lines(caplog) == []


def test_the_setting_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert IngressSettings().ingress.access_log is True
    monkeypatch.setenv("ATMOSPHERE_INGRESS__ACCESS_LOG", "false")
    assert IngressSettings().ingress.access_log is False


# -- rejected tokens, over a real socket ---------------------------------------------------------

REJECTED = "rejected-token-0123456789"
ADMIN = "admin-token-0123456789"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def raw_exchange(url: str, raw: bytes) -> bytes:
    host, _, port = url.removeprefix("http://").rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(raw)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


@pytest.fixture
async def guarded() -> AsyncIterator[str]:
    """Ingress's real `serve()` with a token grant and an admin token, on a loopback port."""
    bus = FakeBus()
    options = IngressOptions(host="127.0.0.1", port=0, drain_grace=2, auth_tokens=(GRANT,))
    grant_only = IngressSettings(ingress=options, admin_token=ADMIN, ai_openai_enabled=True)
    stop = asyncio.Event()
    task = asyncio.create_task(serve(grant_only, stop=stop, bus=bus))
    try:
        url = await bound_url(bus, task)
        await bus.kv_put(subjects.AGENTS_BUCKET, ECHO.name, ECHO)
        await bus.kv_put(subjects.AGENTS_BUCKET, "other", AgentDescriptor(name="other", path="/atmosphere/agent/other"))
        yield url
    finally:
        stop.set()
        await task


async def test_a_rejected_token_is_in_no_log_line_whichever_way_it_came(
    guarded: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = guarded
    host = url.removeprefix("http://")
    with caplog.at_level(logging.DEBUG):
        async with httpx.AsyncClient(base_url=url) as http:
            answers = [
                await http.post(
                    "/atmosphere/agent/echo", content=PROMPT, headers={"Authorization": f"Bearer {REJECTED}"}
                ),
                await http.post("/atmosphere/agent/echo/poll", content=PROMPT, headers={"X-API-Key": REJECTED}),
                await http.post(f"/atmosphere/agent/echo?access_token={REJECTED}", content=PROMPT),
                await http.post(
                    "/atmosphere/v1/chat/completions",
                    json={"model": "echo", "messages": [{"role": "user", "content": PROMPT}]},
                    headers=bearer(REJECTED),
                ),
                await http.get("/api/admin/agents", headers=bearer(REJECTED)),
                # A granted token, on an agent outside its grant: a 403 that must not quote it either.
                await http.post("/atmosphere/agent/other", content=PROMPT, headers={"X-API-Key": GRANT.token}),
            ]
        # A request line the server cannot parse, its query holding the token.
        refused = await raw_exchange(
            url, f"GET http://[::1/?access_token={REJECTED} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        )
        ws = websockets.connect(f"ws://{host}/atmosphere/agent/echo?access_token={REJECTED}")
        async with ws as socket:
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await socket.recv()
        await asyncio.sleep(0.1)  # the socket's access line is written as its handler ends
    assert [a.status_code for a in answers] == [401, 401, 401, 401, 401, 403]
    assert refused.startswith(b"HTTP/1.1 400 ")
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 4401
    assert quoting(caplog, REJECTED, GRANT.token, PROMPT) == []
    assert any(r.getMessage().startswith("refused a malformed HTTP request") for r in caplog.records)
    paths = {r.getMessage().split(" ")[1] for r in access_lines(caplog)}
    assert "/atmosphere/agent/echo" in paths  # the socket's line and the SSE attempts', no query
