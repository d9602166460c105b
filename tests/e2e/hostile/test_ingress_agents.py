"""Hostile input against ingress's own surfaces: raw HTTP, WebSocket, SSE, long-poll, approvals,
cancel, admin and the workspace API.

Every case sends something a hostile (or merely broken) client could send, asserts a clear
answer — a JSON `{"error", "code"}` body with the right status, an error frame on a socket that
stays open, or a clean close with a reason — and then that ingress is still ready and completes
a normal run.
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import websockets

from atmosphere.ingress.settings import IngressOptions
from atmosphere.testing import ToolCallScript, Turn
from tests.e2e.hostile.app import SLOW_WORDS
from tests.e2e.hostile.conftest import HOSTILE_INGRESS, HostileStack, hostile_stack, read_until_terminal

LIMIT = 64 * 1024
"""`HOSTILE_INGRESS.max_message_bytes`."""
AUTH = "Authorization: Bearer hostile-user-token-1\r\n"
HOSTILE_HEAD_LIMIT = HOSTILE_INGRESS.max_header_bytes
DEEP = 30_000
"""Nesting deep enough to exhaust a recursive parser, small enough to stay under the message limit."""

# -- raw HTTP ------------------------------------------------------------------------------------


@dataclass
class Answer:
    """An HTTP answer read off a raw socket, and how many request bytes went out before it."""

    status: int
    headers: dict[str, str]
    body: bytes
    sent: int

    def json(self) -> Any:
        return json.loads(self.body)


def _read_answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body[:length]


def exchange(hostile: HostileStack, pieces: Iterable[bytes], *, pause: float = 0.0) -> Answer:
    """Send `pieces` one by one until the server answers (or all are sent), then read the answer."""
    sent = 0
    with socket.create_connection(hostile.host_port, timeout=15) as sock:
        for piece in pieces:
            if select.select([sock], [], [], pause)[0]:
                break  # answered already: the rest is never sent
            try:
                sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(piece)
        status, headers, body = _read_answer(sock)
    return Answer(status, headers, body, sent)


def repeat(head: bytes, filler: bytes, total: int) -> Iterator[bytes]:
    """`head`, then `filler` until `total` bytes: a huge request that is never built in memory."""
    yield head
    for _ in range(total // len(filler)):
        yield filler


MiB = 1 << 20
BLOCK = b"a" * 65536


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        pytest.param(
            b"GET /readyz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
            431,
            "ingress.headers_too_large",
            id="one-header-over-the-head-limit",
        ),
        pytest.param(
            b"GET /readyz HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(3000)) + b"\r\n",
            431,
            "ingress.headers_too_large",
            id="thousands-of-small-headers",
        ),
        pytest.param(
            b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "ingress.uri_too_long", id="long-path"
        ),
        pytest.param(
            b"GET /readyz?" + b"q=1&" * 1500 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
            414,
            "ingress.uri_too_long",
            id="long-query",
        ),
        pytest.param(b"HELLO\r\n\r\n", 400, "ingress.bad_request", id="garbage-request-line"),
        pytest.param(b"GET / HTTP/1.1\r\nno colon here\r\n\r\n", 400, "ingress.bad_request", id="header-without-colon"),
        pytest.param(b"GET /\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n", 400, "ingress.bad_request", id="non-ascii-path"),
        pytest.param(
            b"GET /readyz HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
            400,
            "ingress.bad_request",
            id="non-numeric-content-length",
        ),
        pytest.param(
            b"POST /atmosphere/agent/echo HTTP/1.1\r\nHost: x\r\n"
            b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            400,
            "ingress.bad_request",
            id="length-and-chunked-at-once",
        ),
        pytest.param(
            b"GET /readyz HTTP/1.1\r\nHost: x\r\nX-Bad: a\x00b\r\n\r\n", 400, "ingress.bad_request", id="nul-in-header"
        ),
        pytest.param(
            b"GET /readyz HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n",
            400,
            "ingress.bad_request",
            id="space-in-header-name",
        ),
        pytest.param(
            b"POST /atmosphere/agent/echo HTTP/1.1\r\nHost: x\r\n"
            + AUTH.encode()
            + b"Content-Length: 100000000\r\n\r\n",
            413,
            "ingress.too_large",
            id="declared-100MB-body",
        ),
        pytest.param(
            b"POST /atmosphere/agent/echo/poll HTTP/1.1\r\nHost: x\r\n"
            + AUTH.encode()
            + b"Content-Length: 100000000\r\n\r\n",
            413,
            "ingress.too_large",
            id="declared-100MB-long-poll-body",
        ),
        pytest.param(
            b"POST /atmosphere/agent/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n",
            401,
            "ingress.unauthorized",
            id="anonymous-100MB-body-is-401-unread",
        ),
        pytest.param(
            b"POST /atmosphere/runs/abc/approval HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n",
            401,
            "ingress.unauthorized",
            id="anonymous-100MB-approval-is-401-unread",
        ),
        pytest.param(
            b"POST /atmosphere/agent/echo HTTP/1.1\r\nHost: x\r\n"
            + AUTH.encode()
            + b"Expect: 100-continue\r\nContent-Length: 100000000\r\n\r\n",
            413,
            "ingress.too_large",
            id="expect-continue-over-the-limit",
        ),
    ],
)
def test_protocol_limits_are_answered_in_json(
    hostile: HostileStack, request_bytes: bytes, status: int, code: str
) -> None:
    answer = exchange(hostile, [request_bytes])
    assert (answer.status, answer.json()["code"]) == (status, code), answer.body
    assert answer.headers["content-type"] == "application/json"
    hostile.check_still_serving()


@pytest.mark.parametrize(
    ("pieces", "status", "code"),
    [
        pytest.param(
            repeat(b"GET /readyz HTTP/1.1\r\nHost: x\r\nX-Big: ", BLOCK, 64 * MiB),
            431,
            "ingress.headers_too_large",
            id="64MiB-header",
        ),
        pytest.param(repeat(b"GET /", BLOCK, 64 * MiB), 414, "ingress.uri_too_long", id="64MiB-request-line"),
        pytest.param(
            repeat(
                b"POST /atmosphere/agent/echo HTTP/1.1\r\nHost: x\r\n"
                + AUTH.encode()
                + b"Transfer-Encoding: chunked\r\n\r\n",
                b"10000\r\n" + BLOCK + b"\r\n",
                64 * MiB,
            ),
            413,
            "ingress.too_large",
            id="64MiB-chunked-body",
        ),
    ],
)
def test_huge_requests_are_refused_before_they_are_read(
    hostile: HostileStack, pieces: Iterator[bytes], status: int, code: str
) -> None:
    answer = exchange(hostile, pieces)
    assert (answer.status, answer.json()["code"]) == (status, code)
    assert answer.sent < 64 * MiB  # answered while the client was still sending
    hostile.check_still_serving()


@pytest.mark.parametrize(
    ("request_bytes", "what"),
    [
        pytest.param(b"GET /readyz HTTP/1.1\r\nHost: x\r\nX-Slow: 1\r\n\r\n", "header", id="slowloris-headers"),
        pytest.param(
            b"POST /atmosphere/agent/echo HTTP/1.1\r\nHost: x\r\n" + AUTH.encode() + b"Content-Length: 40\r\n\r\n",
            "body",
            id="slow-body",
        ),
    ],
)
def test_a_client_trickling_bytes_is_cut_off_with_408(hostile: HostileStack, request_bytes: bytes, what: str) -> None:
    if what == "header":
        pieces: Iterable[bytes] = (bytes([b]) for b in request_bytes)
    else:
        pieces = [request_bytes, *(b"x" for _ in range(40))]
    answer = exchange(hostile, pieces, pause=0.1)
    assert answer.status == 408
    assert answer.json() == {"error": f"The request {what} did not arrive in time", "code": "ingress.request_timeout"}
    hostile.check_still_serving()


def test_a_silent_connection_is_closed(hostile: HostileStack) -> None:
    with socket.create_connection(hostile.host_port, timeout=15) as sock:
        assert sock.recv(1) == b""  # closed by the server, no request ever sent
    hostile.check_still_serving()


def test_an_idle_keep_alive_connection_is_closed(hostile: HostileStack) -> None:
    with socket.create_connection(hostile.host_port, timeout=15) as sock:
        sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, _ = _read_answer(sock)
        assert status == 200
        assert "close" not in headers.get("connection", "")  # kept alive...
        assert sock.recv(1) == b""  # ...until idle too long
    hostile.check_still_serving()


def test_an_answer_before_the_body_says_the_connection_closes(hostile: HostileStack) -> None:
    # Refused (no token) before its body is read: the connection will not carry another request,
    # and the answer must say so, or a keep-alive client sends its next request into the close.
    with socket.create_connection(hostile.host_port, timeout=15) as sock:
        sock.sendall(b"POST /atmosphere/runs/x/approval HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n\r\n")
        status, headers, body = _read_answer(sock)
        assert (status, json.loads(body)["code"]) == (401, "ingress.unauthorized")
        assert headers["connection"] == "close"
        sock.sendall(b"x" * 40)  # the body the client was still sending is read and dropped...
        assert sock.recv(1) == b""  # ...and the connection closed cleanly, not reset
    hostile.check_still_serving()


def _answers(sock: socket.socket, count: int) -> list[int]:
    """The statuses of `count` answers read off one keep-alive connection (they may share a read)."""
    statuses: list[int] = []
    with sock.makefile("rb") as stream:
        for _ in range(count):
            statuses.append(int(stream.readline().split(b" ")[1]))
            length = 0
            while (line := stream.readline()) not in {b"\r\n", b""}:
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            stream.read(length)
    return statuses


def test_pipelined_requests_in_one_read_are_each_answered(hostile: HostileStack) -> None:
    # The head limit counts each request's own head: three small heads in one read are not one big one.
    one = b"GET /readyz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 6000 + b"\r\n\r\n"
    with socket.create_connection(hostile.host_port, timeout=15) as sock:
        sock.sendall(one * 3)
        assert _answers(sock, 3) == [200, 200, 200]
    hostile.check_still_serving()


def test_a_head_just_under_the_limit_with_its_body_in_the_same_read_is_served(hostile: HostileStack) -> None:
    body = b'{"x": 1}'
    start = b"POST /atmosphere/agent/echo/poll HTTP/1.1\r\nHost: x\r\n" + AUTH.encode()
    tail = b"Content-Type: application/json\r\nContent-Length: %d\r\nX-Pad: " % len(body)
    pad = HOSTILE_HEAD_LIMIT - len(start) - len(tail) - len(b"\r\n\r\n")
    head = start + tail + b"p" * pad + b"\r\n\r\n"
    assert len(head) == HOSTILE_HEAD_LIMIT
    answer = exchange(hostile, [head + body])
    assert answer.status != 431, answer.body  # the app answers (a bad prompt is its own 400)
    assert answer.json()["code"] != "ingress.headers_too_large"
    over = exchange(hostile, [start + tail + b"p" * (pad + 1) + b"\r\n\r\n" + body])
    assert (over.status, over.json()["code"]) == (431, "ingress.headers_too_large")
    hostile.check_still_serving()


def test_a_head_sent_in_many_small_pieces_is_measured_whole(hostile: HostileStack) -> None:
    pieces = [b"GET /readyz HTTP/1.1\r\nHost: x\r\n", *(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(400))]
    answer = exchange(hostile, pieces)
    assert (answer.status, answer.json()["code"]) == (431, "ingress.headers_too_large")
    hostile.check_still_serving()


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({"X-Big": "a" * 9000}, id="header-line-over-the-websocket-parser-limit"),
        pytest.param({f"X-H{i}": "v" for i in range(200)}, id="more-headers-than-the-websocket-parser-takes"),
    ],
)
async def test_websocket_handshakes_the_parser_would_choke_on_are_431(
    hostile: HostileStack, headers: dict[str, str]
) -> None:
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(
            f"{hostile.ws}/atmosphere/agent/echo", additional_headers={**hostile.headers, **headers}
        ):
            pass
    assert refused.value.response.status_code == 431
    assert json.loads(refused.value.response.body)["code"] == "ingress.headers_too_large"
    await hostile.assert_still_serving()


# -- connection cap ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def capped(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostileStack]:
    """An ingress of its own that takes at most two connections."""
    options = IngressOptions(port=0, max_connections=2, first_byte_timeout=30.0)
    data = tmp_path_factory.mktemp("capped") / "data"
    with hostile_stack(nats_url, data, ingress=options, names=("ingress",)) as running:
        yield running


async def test_connections_over_the_cap_are_refused_with_503(capped: HostileStack) -> None:
    held = [socket.create_connection(capped.host_port, timeout=15) for _ in range(2)]
    try:
        answer = await asyncio.to_thread(exchange, capped, [b"GET /api/console/info HTTP/1.1\r\nHost: x\r\n\r\n"])
        assert (answer.status, answer.json()["code"]) == (503, "ingress.busy")
        assert answer.headers["retry-after"] == "1"
        # The probes are answered all the same: a busy ingress must not be restarted for it.
        probe = await asyncio.to_thread(exchange, capped, [b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"])
        assert (probe.status, probe.json()["status"]) == (200, "ok")
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(f"{capped.ws}/atmosphere/agent/echo"):
                pass
        assert refused.value.response.status_code == 503
        assert json.loads(refused.value.response.body)["code"] == "ingress.busy"
    finally:
        for sock in held:
            sock.close()

    async def served() -> bool:
        async with httpx.AsyncClient(base_url=capped.url, timeout=10) as http:
            return (await http.get("/readyz")).status_code == 200

    for _ in range(100):  # the server notices the closed sockets at its own pace
        if await served():
            break
        await asyncio.sleep(0.05)
    assert await served()


# -- WebSocket: inbound messages -----------------------------------------------------------------


def _prompt(prompt: Any = "hello", **fields: Any) -> str:
    return json.dumps({"prompt": prompt, **fields})


def _hints(raw_hints: str) -> str:
    return '{"prompt": "hello", "hints": ' + raw_hints + "}"


WS_MESSAGES = [
    pytest.param(_hints('{"a": ' + "[" * DEEP + "]" * DEEP + "}"), "ingress.bad_request", id="hints-nested-30k-deep"),
    pytest.param(
        _hints('{"a": ' + '{"b":' * 10_000 + "1" + "}" * 10_000 + "}"), "ingress.bad_request", id="objects-10k-deep"
    ),
    pytest.param(_hints('{"a": ' + "[" * 100 + "]" * 100 + "}"), "ingress.bad_request", id="hints-nested-100-deep"),
    pytest.param('{"prompt": ' + "[" * DEEP + "]" * DEEP + "}", "ingress.bad_request", id="prompt-nested-deep"),
    pytest.param('{"prompt": "\\ud800"}', "ingress.bad_request", id="lone-high-surrogate-prompt"),
    pytest.param('{"prompt": "ok \\udfff"}', "ingress.bad_request", id="lone-low-surrogate-prompt"),
    pytest.param('{"prompt": "\\udc00\\ud800"}', "ingress.bad_request", id="reversed-surrogate-pair"),
    pytest.param(_hints('{"a": "\\ud800"}'), "ingress.bad_request", id="lone-surrogate-hint-value"),
    pytest.param(_hints('{"\\ud800": 1}'), "ingress.bad_request", id="lone-surrogate-hint-name"),
    pytest.param(_hints('{"a": ["\\ud800"]}'), "ingress.bad_request", id="lone-surrogate-nested-hint"),
    pytest.param(_hints('{"n": ' + "9" * 5000 + "}"), "ingress.bad_request", id="5000-digit-number"),
    pytest.param(_hints('{"n": -' + "9" * 5000 + "}"), "ingress.bad_request", id="5000-digit-negative"),
    pytest.param(_hints('{"n": NaN}'), "ingress.bad_request", id="nan"),
    pytest.param(_hints('{"n": -Infinity}'), "ingress.bad_request", id="infinity"),
    pytest.param(_hints('{"n": 1e999}'), "ingress.bad_request", id="float-overflow"),
    pytest.param(_hints("[]"), "ingress.bad_request", id="hints-list"),
    pytest.param(_hints('"text"'), "ingress.bad_request", id="hints-string"),
    pytest.param(_hints("3"), "ingress.bad_request", id="hints-number"),
    pytest.param(_hints("true"), "ingress.bad_request", id="hints-bool"),
    pytest.param(_hints(json.dumps({f"h{i}": i for i in range(65)})), "ingress.bad_request", id="too-many-hints"),
    pytest.param(_hints(json.dumps({"h" * 200: 1})), "ingress.bad_request", id="hint-name-200-chars"),
    pytest.param(_hints('{"": 1}'), "ingress.bad_request", id="empty-hint-name"),
    pytest.param(_prompt(3), "ingress.bad_request", id="prompt-number"),
    pytest.param(_prompt(None), "ingress.bad_request", id="prompt-null"),
    pytest.param(_prompt(["a"]), "ingress.bad_request", id="prompt-list"),
    pytest.param(_prompt({"a": 1}), "ingress.bad_request", id="prompt-object"),
    pytest.param(_prompt(""), "ingress.bad_request", id="prompt-empty"),
    pytest.param(_prompt(" \n\t "), "ingress.bad_request", id="prompt-whitespace"),
    pytest.param('{"hints": {}}', "ingress.bad_request", id="prompt-missing"),
    pytest.param("", "ingress.bad_request", id="empty-frame"),
    pytest.param("   \n  ", "ingress.bad_request", id="whitespace-frame"),
    pytest.param("x" * (LIMIT + 1), "ingress.too_large", id="one-byte-over-the-limit"),
    pytest.param("é" * (LIMIT // 2 + 1), "ingress.too_large", id="over-the-limit-in-utf8-bytes"),
    pytest.param(b"\xff\xfe\xfd", "ingress.bad_request", id="binary-frame-invalid-utf8"),
    pytest.param(b"\xc3", "ingress.bad_request", id="binary-frame-truncated-utf8"),
    pytest.param("/__approval/", "ingress.bad_request", id="approval-without-id"),
    pytest.param("/__approval/xyz/approve", "ingress.bad_request", id="approval-bad-id"),
    pytest.param("/__approval/apr_" + "f" * 400 + "/approve", "ingress.bad_request", id="approval-id-400-chars"),
    pytest.param("/__approval/apr_ffffffffffff/approve", "ingress.unknown_approval", id="approval-unknown"),
    pytest.param(
        "/__approval/apr_ffffffffffff/approve " + "[" * DEEP + "]" * DEEP,
        "ingress.unknown_approval",
        id="approval-deep-payload",
    ),
    pytest.param(
        '/__approval/apr_ffffffffffff/respond {"a": "\\ud800"}', "ingress.unknown_approval", id="approval-surrogate"
    ),
]


@pytest.mark.parametrize(("message", "code"), WS_MESSAGES)
async def test_a_bad_websocket_message_gets_an_error_frame_and_the_socket_stays(
    hostile: HostileStack, message: str | bytes, code: str
) -> None:
    async with websockets.connect(f"{hostile.ws}/atmosphere/agent/echo", additional_headers=hostile.headers) as ws:
        await ws.send(message)
        frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert (frame["type"], frame["code"], frame["seq"]) == ("error", code, 0), frame
        assert frame["data"]
        await ws.send("the same socket still works")
        frames = await read_until_terminal(ws)
    assert frames[-1]["type"] == "complete"
    await hostile.assert_still_serving()


async def test_a_message_far_over_the_limit_closes_the_socket_with_1009(hostile: HostileStack) -> None:
    async with websockets.connect(f"{hostile.ws}/atmosphere/agent/echo", additional_headers=hostile.headers) as ws:
        await ws.send("x" * (3 * LIMIT))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1009
    await hostile.assert_still_serving()


async def test_bad_messages_never_disturb_a_run_streaming_on_the_same_socket(hostile: HostileStack) -> None:
    async with websockets.connect(f"{hostile.ws}/atmosphere/agent/slow", additional_headers=hostile.headers) as ws:
        await ws.send("story")
        for message, _ in [p.values for p in WS_MESSAGES[:12]]:
            await ws.send(message)
        frames = await read_until_terminal(ws)
    errors = [f for f in frames if f["type"] == "error"]
    assert len(errors) == 12
    assert all(f["seq"] == 0 for f in errors)
    text = "".join(f["data"] for f in frames if f.get("type") == "streaming-text")
    assert text == "".join(f"story-{i} " for i in range(SLOW_WORDS))
    assert frames.index(errors[-1]) < len(frames) - 1  # the errors came while the run streamed on
    await hostile.assert_still_serving()


async def test_more_prompts_than_a_socket_may_run_get_an_error_frame(hostile: HostileStack) -> None:
    async with websockets.connect(f"{hostile.ws}/atmosphere/agent/slow", additional_headers=hostile.headers) as ws:
        for i in range(5):
            await ws.send(f"p{i}")
        completes, refused = 0, []
        while completes < 4:
            frame = json.loads(await asyncio.wait_for(ws.recv(), 15))
            completes += frame.get("type") == "complete"
            if frame.get("type") == "error":
                refused.append(frame)
    assert len(refused) == 1
    assert "At most 4 prompts" in refused[0]["data"]
    await hostile.assert_still_serving()


# -- WebSocket: the handshake --------------------------------------------------------------------

USER = {"Authorization": "Bearer hostile-user-token-1"}
OTHER = {"Authorization": "Bearer hostile-other-token-2"}


@pytest.mark.parametrize(
    ("path", "headers", "code"),
    [
        pytest.param("/atmosphere/agent/" + "a" * 200, USER, 4404, id="agent-name-200-chars"),
        pytest.param("/atmosphere/agent/" + "é" * 100, USER, 4404, id="agent-name-multibyte"),
        pytest.param("/atmosphere/agent/" + "%F0%9F%98%80" * 60, USER, 4404, id="agent-name-emoji"),
        pytest.param("/atmosphere/agent/nobody", USER, 4404, id="unknown-agent"),
        pytest.param("/atmosphere/agent/a..b", USER, 4404, id="dotted-agent-name"),
        pytest.param("/some/endpoint/" + "x" * 300, USER, 4404, id="unknown-endpoint-path"),
        pytest.param("/atmosphere/agent/echo", {}, 4401, id="no-token"),
        pytest.param("/atmosphere/agent/echo", {"Authorization": "Bearer " + "é" * 100}, 4401, id="unknown-long-token"),
        pytest.param("/atmosphere/agent/echo", {"Authorization": "Basic Zm9vOmJhcg=="}, 4401, id="basic-auth"),
        pytest.param("/atmosphere/agent/slow", OTHER, 4403, id="token-for-another-path"),
        pytest.param("/atmosphere/agent/echo?runId=a..b", USER, 1008, id="malformed-run-id"),
        pytest.param("/atmosphere/agent/echo?runId=" + "r" * 200, USER, 1008, id="run-id-200-chars"),
        pytest.param("/atmosphere/agent/echo?runId=abc&lastSeq=-x", USER, 1008, id="last-seq-not-a-number"),
        pytest.param(
            "/atmosphere/agent/echo?runId=abc",
            USER | {"X-Atmosphere-Last-Seq": "9" * 5000},
            1008,
            id="last-seq-5000-digits",
        ),
        pytest.param("/atmosphere/agent/echo?conversationId=" + "c" * 300, USER, 1008, id="conversation-id-300-chars"),
        pytest.param("/atmosphere/agent/echo?conversationId=..%2F..%2Fetc", USER, 1008, id="conversation-id-traversal"),
        pytest.param(
            "/atmosphere/agent/echo",
            USER | {"X-Atmosphere-Conversation-Id": "é" * 50},
            1008,
            id="conversation-id-non-ascii",
        ),
    ],
)
async def test_a_refused_websocket_closes_cleanly_with_a_short_reason(
    hostile: HostileStack, path: str, headers: dict[str, str], code: int
) -> None:
    with pytest.raises(websockets.ConnectionClosed) as closed:
        async with websockets.connect(hostile.ws + path, additional_headers=headers) as ws:
            await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None, "closed without a close frame"
    assert closed.value.rcvd.code == code
    assert closed.value.rcvd.reason
    assert len(closed.value.rcvd.reason.encode()) <= 123
    await hostile.assert_still_serving()


async def test_resuming_a_run_that_does_not_exist_is_an_error_frame(hostile: HostileStack) -> None:
    url = f"{hostile.ws}/atmosphere/agent/echo?runId=nosuchrun{uuid.uuid4().hex[:8]}"
    async with websockets.connect(url, additional_headers=hostile.headers) as ws:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert (frame["type"], frame["code"]) == ("error", "ingress.unknown_run")
        await ws.send("still usable")
        assert (await read_until_terminal(ws))[-1]["type"] == "complete"
    await hostile.assert_still_serving()


# -- SSE and long-poll prompts -------------------------------------------------------------------

BAD_PROMPT_BODIES = [
    pytest.param(b"", {}, 400, "ingress.bad_request", id="empty"),
    pytest.param(b"  \n\t ", {}, 400, "ingress.bad_request", id="whitespace"),
    pytest.param(b"\xff\xfe", {}, 400, "ingress.bad_request", id="invalid-utf8"),
    pytest.param(b"ok \xed\xa0\x80", {}, 400, "ingress.bad_request", id="utf8-encoded-surrogate"),
    pytest.param(b"x" * (LIMIT + 1), {}, 413, "ingress.too_large", id="one-byte-over-the-limit"),
    pytest.param(_hints('{"a": ' + "[" * DEEP + "]" * DEEP + "}").encode(), {}, 400, "ingress.bad_request", id="deep"),
    pytest.param(b'{"prompt": "\\ud800"}', {}, 400, "ingress.bad_request", id="lone-surrogate"),
    pytest.param(_hints('{"n": ' + "1" * 5000 + "}").encode(), {}, 400, "ingress.bad_request", id="5000-digits"),
    pytest.param(_hints('{"n": NaN}').encode(), {}, 400, "ingress.bad_request", id="nan"),
    pytest.param(_hints("[1]").encode(), {}, 400, "ingress.bad_request", id="hints-list"),
    pytest.param(_prompt(42).encode(), {}, 400, "ingress.bad_request", id="prompt-number"),
    pytest.param(b"/__approval/apr_ffffffffffff/approve", {}, 400, "ingress.bad_request", id="approval-as-prompt"),
    pytest.param(b"hi", {"X-Atmosphere-Conversation-Id": "c" * 200}, 400, "ingress.bad_request", id="long-conv-id"),
    pytest.param(b"hi", {"X-Atmosphere-Conversation-Id": "../x"}, 400, "ingress.bad_request", id="traversal-conv-id"),
    pytest.param(b"hi", {"Authorization": ""}, 401, "ingress.unauthorized", id="no-token"),
    pytest.param(b"hi", {"Authorization": "Bearer nope-nope-nope"}, 401, "ingress.unauthorized", id="bad-token"),
]


@pytest.mark.parametrize("route", ["/atmosphere/agent/echo", "/atmosphere/agent/echo/poll"])
@pytest.mark.parametrize(("body", "headers", "status", "code"), BAD_PROMPT_BODIES)
async def test_a_bad_posted_prompt_is_a_json_error(
    hostile: HostileStack, route: str, body: bytes, headers: dict[str, str], status: int, code: str
) -> None:
    async with httpx.AsyncClient(base_url=hostile.url, timeout=10) as http:
        answer = await http.post(route, content=body, headers={**hostile.headers, **headers})
    assert (answer.status_code, answer.json()["code"]) == (status, code), answer.text
    assert answer.json()["error"]
    await hostile.assert_still_serving()


@pytest.mark.parametrize(
    ("method", "path", "headers", "status", "code"),
    [
        pytest.param(
            "POST", "/atmosphere/agent/" + "a" * 200, None, 404, "ingress.unknown_agent", id="long-agent-name"
        ),
        pytest.param("POST", "/atmosphere/agent/nobody/poll", None, 404, "ingress.unknown_agent", id="unknown-poll"),
        pytest.param("POST", "/atmosphere/agent/slow", OTHER, 403, "ingress.forbidden", id="other-path-token"),
        pytest.param("PUT", "/atmosphere/agent/echo", None, 405, "ingress.method_not_allowed", id="put"),
        pytest.param("GET", "/atmosphere/runs/a..b/events", None, 400, "ingress.bad_request", id="resume-bad-id"),
        pytest.param(
            "GET", "/atmosphere/runs/" + "r" * 200 + "/events", None, 400, "ingress.bad_request", id="long-id"
        ),
        pytest.param("GET", "/atmosphere/runs/nosuchrun/events", None, 404, "ingress.unknown_run", id="resume-unknown"),
        pytest.param(
            "GET", "/atmosphere/runs/x/events", {"Last-Event-ID": "abc"}, 400, "ingress.bad_request", id="lei"
        ),
        pytest.param(
            "GET", "/atmosphere/runs/x/events", {"Last-Event-ID": "9" * 5000}, 400, "ingress.bad_request", id="lei-5000"
        ),
        pytest.param("GET", "/atmosphere/runs/x/events?lastEventId=-1", None, 400, "ingress.bad_request", id="lei-neg"),
        pytest.param("GET", "/atmosphere/runs/x/events", {"Authorization": ""}, 401, "ingress.unauthorized", id="anon"),
        pytest.param("GET", "/atmosphere/runs/x/poll?after=-1", None, 400, "ingress.bad_request", id="poll-after-neg"),
        pytest.param("GET", "/atmosphere/runs/x/poll?after=abc", None, 400, "ingress.bad_request", id="poll-after-abc"),
        pytest.param(
            "GET", "/atmosphere/runs/x/poll?after=" + "9" * 5000, None, 414, "ingress.uri_too_long", id="poll-5000"
        ),
        pytest.param(
            "GET", "/atmosphere/runs/x/poll?after=" + "9" * 30, None, 400, "ingress.bad_request", id="poll-big"
        ),
        pytest.param("GET", "/atmosphere/runs/x/poll?wait=1e9", None, 400, "ingress.bad_request", id="poll-wait-huge"),
        pytest.param("GET", "/atmosphere/runs/x/poll?wait=nan", None, 400, "ingress.bad_request", id="poll-wait-nan"),
        pytest.param("GET", "/atmosphere/runs/a..b/poll", None, 400, "ingress.bad_request", id="poll-bad-id"),
        pytest.param("GET", "/atmosphere/runs/nosuchrun/poll", None, 404, "ingress.unknown_run", id="poll-unknown"),
        pytest.param("POST", "/atmosphere/runs/a..b/cancel", None, 400, "ingress.bad_request", id="cancel-bad-id"),
        pytest.param(
            "POST", "/atmosphere/runs/nosuchrun/cancel", None, 404, "ingress.unknown_run", id="cancel-unknown"
        ),
        pytest.param(
            "POST", "/atmosphere/runs/x/cancel", {"Authorization": ""}, 401, "ingress.unauthorized", id="c-anon"
        ),
        pytest.param("GET", "/atmosphere/runs/x/cancel", None, 405, "ingress.method_not_allowed", id="cancel-get"),
        pytest.param("POST", "/atmosphere/runs/a..b/approval", None, 400, "ingress.bad_request", id="approval-bad-id"),
        pytest.param(
            "POST", "/atmosphere/runs/nosuchrun/approval", None, 404, "ingress.unknown_run", id="appr-unknown"
        ),
    ],
)
async def test_bad_run_requests_are_json_errors(
    hostile: HostileStack, method: str, path: str, headers: dict[str, str] | None, status: int, code: str
) -> None:
    async with httpx.AsyncClient(base_url=hostile.url, timeout=10) as http:
        answer = await http.request(method, path, content=b"hello", headers={**hostile.headers, **(headers or {})})
    assert (answer.status_code, answer.json()["code"]) == (status, code), answer.text
    assert answer.json()["error"]
    await hostile.assert_still_serving()


# -- approvals over HTTP -------------------------------------------------------------------------


async def _pending_approval(hostile: HostileStack) -> tuple[websockets.ClientConnection, str, str]:
    """A `notes` run waiting for its approval: (its socket, run id, approval id)."""
    hostile.script(Turn.tool_calls(ToolCallScript("delete_note", {"title": "groceries"})), Turn.text("Done."))
    ws = await websockets.connect(f"{hostile.ws}/atmosphere/agent/notes", additional_headers=hostile.headers)
    await ws.send("delete my groceries note")
    run_id = json.loads(await asyncio.wait_for(ws.recv(), 10))["value"]  # the run's first frame names it
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
        if frame.get("event") == "approval-required":
            return ws, run_id, frame["data"]["approvalId"]


async def test_hostile_approval_bodies_never_resolve_a_pending_approval(hostile: HostileStack) -> None:
    ws, run_id, approval_id = await _pending_approval(hostile)
    hostile_bodies = [
        (b"x" * (LIMIT + 1), 413, "ingress.too_large"),
        (b"/__approval/" + approval_id.encode() + b"/approve \xff", 400, "ingress.bad_request"),
        (b"approve it please", 400, "ingress.bad_request"),
        (b"/__approval/", 400, "ingress.bad_request"),
        (b"/__approval/apr_" + b"f" * 300 + b"/approve", 400, "ingress.bad_request"),
    ]
    async with httpx.AsyncClient(base_url=hostile.url, timeout=10) as http:
        path = f"/atmosphere/runs/{run_id}/approval"
        for body, status, code in hostile_bodies:
            answer = await http.post(path, content=body, headers=hostile.headers)
            assert (answer.status_code, answer.json()["code"]) == (status, code), answer.text
        anonymous = await http.post(path, content=f"/__approval/{approval_id}/approve")
        assert anonymous.status_code == 401
        approved = await http.post(path, content=f"/__approval/{approval_id}/approve", headers=hostile.headers)
        assert approved.json()["accepted"] is True
    try:
        frames = await read_until_terminal(ws)
    finally:
        await ws.close()
    assert [f["data"]["result"] for f in frames if f.get("event") == "tool-result"] == ["deleted note 'groceries'"]
    await hostile.assert_still_serving()


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param("[" * DEEP + "]" * DEEP, id="deep"),
        pytest.param('{"title": "\\ud800"}', id="lone-surrogate"),
        pytest.param('{"title": ' + "7" * 5000 + "}", id="5000-digits"),
        pytest.param('{"title": NaN}', id="nan"),
        pytest.param("[1, 2]", id="not-an-object"),
    ],
)
async def test_unusable_edited_arguments_deny_the_tool(hostile: HostileStack, payload: str) -> None:
    ws, _, approval_id = await _pending_approval(hostile)
    try:
        await ws.send(f"/__approval/{approval_id}/approve {payload}")
        frames = await read_until_terminal(ws)
    finally:
        await ws.close()
    assert frames[-1]["type"] == "complete"
    assert not [f for f in frames if f.get("event") == "tool-result" and "deleted note" in str(f["data"])]
    await hostile.assert_still_serving()


# -- admin and workspace -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "admin", "status", "code"),
    [
        pytest.param("/api/admin/agents", False, 401, "admin.unauthorized", id="no-admin-token"),
        pytest.param("/api/admin/tape/runs?limit=abc", True, 400, "ingress.bad_request", id="limit-abc"),
        pytest.param("/api/admin/tape/runs?limit=0", True, 400, "ingress.bad_request", id="limit-zero"),
        pytest.param("/api/admin/tape/runs?limit=" + "9" * 40, True, 400, "ingress.bad_request", id="limit-huge"),
        pytest.param("/api/admin/tape/runs?tapeId=" + "t" * 200, True, 400, "ingress.bad_request", id="tape-id-long"),
        pytest.param("/api/admin/tape/runs/a..b/steps", True, 400, "admin.bad_request", id="steps-bad-id"),
        pytest.param("/api/admin/tape/runs/x/steps?fromSeq=-1", True, 400, "ingress.bad_request", id="steps-neg"),
        pytest.param("/api/admin/governance/decisions?limit=-5", True, 400, "ingress.bad_request", id="decisions-neg"),
        pytest.param("/api/admin/nothing/here", True, 404, "admin.not_found", id="unknown-admin-path"),
        pytest.param("/api/admin/agents/echo/files?sessionId=s&path=../etc", True, 400, "admin.bad_request", id="up"),
        pytest.param("/api/admin/agents/echo/files?sessionId=s&path=%00", True, 400, "admin.bad_request", id="nul"),
        pytest.param("/api/admin/agents/echo/files?sessionId=s&path=/etc", True, 400, "admin.bad_request", id="abs"),
        pytest.param(
            "/api/admin/agents/echo/files?sessionId=s&path=" + "p" * 1100, True, 400, "ingress.bad_request", id="p-long"
        ),
        pytest.param(
            "/api/admin/agents/echo/files?sessionId=" + "s" * 200, True, 400, "ingress.bad_request", id="session-long"
        ),
        pytest.param(
            "/api/admin/agents/echo/files/content?sessionId=s&path=.", True, 400, "admin.bad_request", id="read-dot"
        ),
        pytest.param(
            "/api/admin/agents/echo/files/content?sessionId=s", True, 400, "ingress.bad_request", id="no-path"
        ),
        pytest.param("/api/admin/agents/echo/plan", True, 400, "ingress.bad_request", id="plan-no-session"),
    ],
)
async def test_bad_admin_reads_are_json_errors(
    hostile: HostileStack, path: str, admin: bool, status: int, code: str
) -> None:
    headers = {"Authorization": f"Bearer {hostile.admin_token}"} if admin else {}
    async with httpx.AsyncClient(base_url=hostile.url, timeout=10) as http:
        answer = await http.get(path, headers=headers)
    assert (answer.status_code, answer.json().get("code")) == (status, code), answer.text
    await hostile.assert_still_serving()
