"""The built-in runtime's HTTP/1.1 transport against real loopback servers, well-behaved and not.

Each server is a few lines of raw HTTP on asyncio's sockets, so every framing (chunked, sized,
until close), every way a connection ends, and every bound is the wire's, not a mock's. Every
test runs on asyncio's own loop, and again on uvloop, which the services run on (its transports
are no `asyncio.Transport` subclasses: a transport that assumed one failed every call there).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gzip
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from atmosphere.dispatch.runtime.http11 import MAX_CHUNK_LINE, MAX_HEAD_BYTES, Http11Transport

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def serving(handler: Handler, *, tls: ssl.SSLContext | None = None) -> AsyncIterator[tuple[str, list[int]]]:
    """A loopback server running `handler` per connection: its base URL and its connection count.

    Handlers still running when the server goes are cancelled and awaited (none outlives its test).
    """
    accepted: list[int] = []
    handlers: set[asyncio.Task[None]] = set()

    async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(counted, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}", accepted
    finally:
        server.close()
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request: its head and its body (by Content-Length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head, await reader.readexactly(length)


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def answering(response: bytes, *, requests: int = 100) -> Handler:
    """Answer up to `requests` requests on a connection, each with `response`."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(requests):
            await read_request(reader)
            writer.write(response)
            await writer.drain()

    return handler


CHUNKED_OK = (
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunk(b"hello ") + chunk(b"world") + b"0\r\n\r\n"
)


def client(**kwargs: object) -> httpx.AsyncClient:
    transport = Http11Transport(max_connections=int(kwargs.pop("max_connections", 4)))  # type: ignore[call-overload]
    return httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(5.0), **kwargs)  # type: ignore[arg-type]


async def test_a_chunked_body_is_read_and_its_connection_reused() -> None:
    async with serving(answering(CHUNKED_OK)) as (url, accepted), client() as http:
        bodies = [(await http.post(f"{url}/v1/x", json={"n": n})).text for n in range(3)]
    assert bodies == ["hello world"] * 3
    assert len(accepted) == 1


async def test_the_request_reaches_the_server_as_sent() -> None:
    seen: list[tuple[bytes, bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()

    async with serving(handler) as (url, _), client() as http:
        response = await http.post(
            f"{url}/v1/chat/completions?x=1", json={"a": "é"}, headers={"Authorization": "Bearer k"}
        )
    assert response.text == "ok"
    head, body = seen[0]
    assert head.startswith(b"POST /v1/chat/completions?x=1 HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer k\r\n" in head or b"\r\nauthorization: Bearer k\r\n" in head
    assert body == '{"a":"é"}'.encode()


async def test_pieces_arrive_as_the_server_sends_them() -> None:
    """The second piece is sent only once the client has read the first: nothing waits for the end."""
    first_read = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunk(b"data: one\n\n"))
        await writer.drain()
        await asyncio.wait_for(first_read.wait(), 5)
        writer.write(chunk(b"data: two\n\n") + b"0\r\n\r\n")
        await writer.drain()

    async with serving(handler) as (url, _), client() as http, http.stream("POST", f"{url}/s", json={}) as response:
        lines = []
        async for line in response.aiter_lines():
            lines.append(line)
            first_read.set()
    assert lines == ["data: one", "", "data: two", ""]


async def test_a_chunk_split_across_reads_and_chunk_extensions_and_trailers() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        wire = (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"B;name=v\r\nhello world\r\n0\r\nx-t: 1\r\n\r\n"
        )
        for i in range(len(wire)):  # a byte at a time: every boundary falls inside something
            writer.write(wire[i : i + 1])
            await writer.drain()
        await reader.read()

    async with serving(handler) as (url, _), client() as http:
        assert (await http.get(f"{url}/")).text == "hello world"


KEPT_OR_NOT = [
    (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", True),
    (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello", False),
    (b"HTTP/1.0 200 OK\r\ncontent-length: 5\r\n\r\nhello", False),
    (b"HTTP/1.1 204 No Content\r\n\r\n", True),
]


@pytest.mark.parametrize(("response", "reusable"), KEPT_OR_NOT)
async def test_a_connection_is_kept_only_when_the_response_allows(response: bytes, reusable: bool) -> None:
    async with serving(answering(response)) as (url, accepted), client() as http:
        statuses = [(await http.get(f"{url}/")).status_code for _ in range(2)]
    assert statuses == [int(response.split(b" ")[1])] * 2
    assert len(accepted) == (1 if reusable else 2)


async def test_a_body_delimited_by_the_close_is_read_whole() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n\r\nuntil ")
        await writer.drain()
        writer.write(b"the end")
        await writer.drain()

    async with serving(handler) as (url, accepted), client() as http:
        assert [(await http.get(f"{url}/")).text for _ in range(2)] == ["until the end"] * 2
    assert len(accepted) == 2


async def test_an_idle_connection_the_server_closed_is_replaced() -> None:
    async with serving(answering(CHUNKED_OK, requests=1)) as (url, accepted), client() as http:
        first = await http.get(f"{url}/")
        await asyncio.sleep(0.05)  # the server's close reaches the idle connection
        second = await http.get(f"{url}/")
    assert [first.text, second.text] == ["hello world"] * 2
    assert len(accepted) == 2


async def test_a_reused_connection_that_dies_on_the_request_is_replaced_once() -> None:
    """The keep-alive race: the server reads the next request and closes without a byte of answer."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(CHUNKED_OK)
        await writer.drain()
        await read_request(reader)  # then hangs up: the request raced the idle close

    async with serving(handler) as (url, accepted), client() as http:
        texts = [(await http.get(f"{url}/")).text for _ in range(2)]
    assert texts == ["hello world"] * 2
    assert len(accepted) == 2


async def test_a_new_connection_that_dies_before_answering_fails_plainly() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async with serving(handler) as (url, accepted), client() as http:
        with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
            await http.get(f"{url}/")
    assert len(accepted) == 1  # no second try on a fresh connection: the server saw the request


BROKEN = [
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", "malformed chunk size"),
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabcd\r\n", "did not end where its size said"),
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + b"1" * 2000, "framing line is too long"),
    (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort", "before the body's end"),
    (b"HTTP/1.1 200 OK\r\ncontent-length: ten\r\n\r\n", "malformed Content-Length"),
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nab", "before the body's end"),
    (b"SMTP ready\r\n\r\n", "malformed status line"),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header line"),
    (b"HTTP/1.1 200 OK\r\nx: " + b"a" * (MAX_HEAD_BYTES + 10), "head exceeded"),
]


@pytest.mark.parametrize(("response", "match"), BROKEN)
async def test_a_broken_response_is_a_protocol_error(response: bytes, match: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(response)
        await writer.drain()
        writer.close()

    async with serving(handler) as (url, accepted), client() as http:
        for _ in range(2):  # and the connection it broke is not used again
            with pytest.raises(httpx.RemoteProtocolError, match=match):
                await http.get(f"{url}/")
    assert len(accepted) == 2


async def test_the_largest_head_and_chunk_line_the_limits_allow_are_read() -> None:
    """A head of exactly `MAX_HEAD_BYTES` (status line and every header) and a chunk-size line at its bound."""
    start = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nx-pad: "
    head = start + b"a" * (MAX_HEAD_BYTES - len(start)) + b"\r\n\r\n"
    size_line = b"5;" + b"e" * (MAX_CHUNK_LINE - 2)
    response = head + size_line + b"\r\nhello\r\n0\r\n\r\n"
    async with serving(answering(response)) as (url, accepted), client() as http:
        replies = [await http.get(f"{url}/") for _ in range(2)]
    assert [r.text for r in replies] == ["hello"] * 2
    assert len(replies[0].headers["x-pad"]) == MAX_HEAD_BYTES - len(start)
    assert len(accepted) == 1


async def test_interim_responses_are_skipped() -> None:
    response = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    async with serving(answering(response)) as (url, _), client() as http:
        assert (await http.post(f"{url}/", content=b"x")).text == "ok"


async def test_content_encoding_is_decoded_by_httpx() -> None:
    packed = gzip.compress(b'{"data": []}')
    response = b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n%s" % (len(packed), packed)
    async with serving(answering(response)) as (url, _), client() as http:
        assert (await http.get(f"{url}/models")).json() == {"data": []}


async def test_a_stalled_server_is_a_read_timeout_and_costs_its_connection() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunk(b"one"))
        await writer.drain()
        await reader.read()  # nothing more until the client hangs up

    async with serving(handler) as (url, accepted):
        transport = Http11Transport(max_connections=1)
        async with httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(5.0, read=0.2)) as http:
            for _ in range(2):
                async with http.stream("GET", f"{url}/") as response:
                    pieces = response.aiter_raw()
                    assert await anext(pieces) == b"one"
                    with pytest.raises(httpx.ReadTimeout):
                        await anext(pieces)
    assert len(accepted) == 2  # the slot came free; the stalled connection did not come back


async def test_a_response_closed_before_its_end_takes_its_connection() -> None:
    async with serving(answering(CHUNKED_OK)) as (url, accepted), client() as http:
        for _ in range(2):
            async with http.stream("GET", f"{url}/") as response:
                assert response.status_code == 200  # the body never read
    assert len(accepted) == 2


async def test_nothing_listening_is_a_connect_error() -> None:
    async with serving(answering(CHUNKED_OK)) as (url, _):
        pass  # closed: the port is free again
    async with client() as http:
        with pytest.raises(httpx.ConnectError):
            await http.get(f"{url}/")


async def test_requests_beyond_the_pool_wait_for_a_slot_and_time_out_at_the_pool_timeout() -> None:
    release, received = asyncio.Event(), asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            received.set()
            await release.wait()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()

    async with serving(handler) as (url, accepted):
        transport = Http11Transport(max_connections=1)
        async with httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(5.0, pool=0.1)) as http:
            first = asyncio.create_task(http.get(f"{url}/"))
            await asyncio.wait_for(received.wait(), 5)  # the one slot is taken
            with pytest.raises(httpx.PoolTimeout):
                await http.get(f"{url}/")
            waiting = asyncio.create_task(http.get(f"{url}/", timeout=httpx.Timeout(5.0)))
            release.set()
            assert [(await first).text, (await waiting).text] == ["ok", "ok"]
    assert len(accepted) == 1


async def test_a_cancelled_request_frees_its_slot_and_drops_its_connection() -> None:
    connections: list[int] = []
    received = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        if len(connections) == 1:  # the first connection never answers
            await read_request(reader)
            received.set()
            await reader.read()
            return
        await answering(CHUNKED_OK)(reader, writer)

    async with serving(handler) as (url, _), client(max_connections=1) as http:
        pending = asyncio.create_task(http.get(f"{url}/"))
        await asyncio.wait_for(received.wait(), 5)  # cancelled while it waits for the answer
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
        assert (await http.get(f"{url}/")).text == "hello world"
    assert len(connections) == 2


async def test_a_request_cancelled_while_its_body_streams_frees_its_slot() -> None:
    """A run cancelled mid-answer: its connection goes (the rest of the body is not wanted), the slot comes free."""
    streaming = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunk(b"data: one\n\n"))
        await writer.drain()
        await reader.read()  # more never comes; the client hangs up

    async def read_forever(http: httpx.AsyncClient, url: str) -> None:
        async with http.stream("GET", f"{url}/") as response:
            async for _ in response.aiter_raw():
                streaming.set()

    async with serving(handler) as (url, accepted), client(max_connections=1) as http:
        for _ in range(2):
            streaming.clear()
            reader = asyncio.create_task(read_forever(http, url))
            await asyncio.wait_for(streaming.wait(), 5)
            reader.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reader
    assert len(accepted) == 2  # the one slot came free twice; neither connection went back to the pool


async def test_many_requests_share_a_bounded_pool() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            await asyncio.sleep(0.01)
            writer.write(CHUNKED_OK)
            await writer.drain()

    async with serving(handler) as (url, accepted), client(max_connections=4) as http:
        texts = await asyncio.gather(*(http.get(f"{url}/{n}") for n in range(40)))
    assert [t.text for t in texts] == ["hello world"] * 40
    assert len(accepted) <= 4


async def test_an_unsupported_scheme_is_refused() -> None:
    async with client() as http:
        with pytest.raises(httpx.UnsupportedProtocol):
            await http.get("ftp://127.0.0.1/")


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that is its own authority: (cert, key)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl to make a test certificate with")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subject = ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            *subject,
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_https_is_verified_against_the_trusted_authorities(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(cert, key)
    async with serving(answering(CHUNKED_OK), tls=server_side) as (url, accepted):
        trusting = Http11Transport(max_connections=2, ssl_context=ssl.create_default_context(cafile=str(cert)))
        async with httpx.AsyncClient(transport=trusting) as http:
            assert [(await http.get(f"{url}/")).text for _ in range(2)] == ["hello world"] * 2
        async with httpx.AsyncClient(transport=Http11Transport(max_connections=2)) as http:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await http.get(f"{url}/")
    assert len(accepted) == 1  # both trusted requests on one connection; the refused handshake never got in


async def every_case(test: Callable[..., Awaitable[None]], cases: list[tuple[bytes, Any]]) -> None:
    for case in cases:
        await test(*case)


ON_UVLOOP: list[Callable[[], Awaitable[None]]] = [
    test_a_chunked_body_is_read_and_its_connection_reused,
    test_the_request_reaches_the_server_as_sent,
    test_pieces_arrive_as_the_server_sends_them,
    test_a_chunk_split_across_reads_and_chunk_extensions_and_trailers,
    functools.partial(every_case, test_a_connection_is_kept_only_when_the_response_allows, KEPT_OR_NOT),
    test_a_body_delimited_by_the_close_is_read_whole,
    test_an_idle_connection_the_server_closed_is_replaced,
    test_a_reused_connection_that_dies_on_the_request_is_replaced_once,
    test_a_new_connection_that_dies_before_answering_fails_plainly,
    functools.partial(every_case, test_a_broken_response_is_a_protocol_error, BROKEN),
    test_the_largest_head_and_chunk_line_the_limits_allow_are_read,
    test_interim_responses_are_skipped,
    test_content_encoding_is_decoded_by_httpx,
    test_a_stalled_server_is_a_read_timeout_and_costs_its_connection,
    test_a_response_closed_before_its_end_takes_its_connection,
    test_nothing_listening_is_a_connect_error,
    test_requests_beyond_the_pool_wait_for_a_slot_and_time_out_at_the_pool_timeout,
    test_a_cancelled_request_frees_its_slot_and_drops_its_connection,
    test_a_request_cancelled_while_its_body_streams_frees_its_slot,
    test_many_requests_share_a_bounded_pool,
    test_an_unsupported_scheme_is_refused,
]


@pytest.mark.parametrize("scenario", ON_UVLOOP, ids=lambda s: getattr(s, "__name__", None) or s.args[0].__name__)
def test_on_uvloop(scenario: Callable[[], Awaitable[None]]) -> None:
    """The same, on the loop `atmosphere.service.run` runs dispatch on."""
    uvloop = pytest.importorskip("uvloop")
    uvloop.run(scenario())


def test_https_on_uvloop(tmp_path: Path) -> None:
    uvloop = pytest.importorskip("uvloop")
    uvloop.run(test_https_is_verified_against_the_trusted_authorities(tmp_path))
