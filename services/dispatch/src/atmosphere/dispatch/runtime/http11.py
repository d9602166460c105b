"""An HTTP/1.1 transport for httpx on asyncio's own sockets: the provider's stream at a fraction of the CPU.

httpx's default transport (httpcore, h11, anyio) spends about 80 µs of CPU on each piece of a
streamed body before the bytes reach httpx: a parser event, a cancel scope and a task
checkpoint per read. A model streams a piece per token, so that was the largest part of a
token's cost in dispatch. This transport reads the socket with an `asyncio.Protocol` and cuts
the body itself (`Content-Length`, `chunked`, or until close), so a piece costs a wake-up and a
few slices. httpx still owns everything above the transport: the request's encoding, the
response's content decoding, redirects, env proxies (mounted by the client ahead of this
transport) and the exception types, which this transport raises as httpx's own.

Connections are kept per origin and reused once a response was read to its end; a response
closed before its end, one that said `Connection: close`, or one delimited by the close itself
takes its connection with it. A pooled connection the server closed while it was idle is never
used; one that dies before answering a byte of a reused request is replaced once, at once (a
keep-alive race, as every HTTP client handles it).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import cast

import httpx

MAX_HEAD_BYTES = 64 * 1024
"""A response's status line and headers larger than this are refused (a broken or hostile server)."""

MAX_CHUNK_LINE = 1024
"""A chunk-size line longer than this is refused."""

READ_HIGH_WATER = 256 * 1024
"""Bytes buffered from the socket before reading pauses until the body is consumed."""

NO_BODY_STATUSES = frozenset({204, 304})

HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")


class _ClosedError(Exception):
    """The peer closed the connection (EOF) where more was expected."""


class _Connection(asyncio.Protocol):
    """One socket: its bytes in a buffer, one reader waiting on it at a time."""

    def __init__(self, origin: tuple[str, str, int]) -> None:
        self.origin = origin
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.eof = False
        self.error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None
        self._paused = False
        self.reused = False
        """Whether this connection carried a response before the current one."""
        self.answered = False
        """Whether the server sent anything since the current request went out."""

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, though uvloop's (what the services run on) is no asyncio.Transport subclass.
        self.transport = cast("asyncio.Transport", transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self.answered = True
        if len(self.buffer) > READ_HIGH_WATER and self.transport is not None and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.error = exc
        self._wake()
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- used by the transport -----------------------------------------------------------------

    @property
    def usable(self) -> bool:
        """Idle and sound: not closed by the server, nothing unasked for in its buffer."""
        return not self.eof and not self.buffer and self.transport is not None and not self.transport.is_closing()

    async def write(self, data: bytes, timeout: float | None) -> None:
        assert self.transport is not None
        if self.eof:
            raise httpx.WriteError("the connection was closed before the request was sent")
        self.transport.write(data)
        if self._writable is not None:
            try:
                async with asyncio.timeout(timeout):
                    await self._writable
            except TimeoutError:
                raise httpx.WriteTimeout("the request could not be sent in time") from None
            if self.eof:
                raise httpx.WriteError("the connection broke while the request was sent")

    async def fill(self, timeout: float | None) -> None:
        """Wait for more bytes (or the end) after what the buffer holds; `_ClosedError` at the end."""
        if self.eof:
            raise self._ended()
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout, _expire, waiter) if timeout is not None else None
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()
        if self.buffer or not self.eof:
            return
        raise self._ended()

    def _ended(self) -> Exception:
        """Why nothing more will come: the connection broke (`ReadError`) or the server closed it."""
        if self.error is not None:
            return httpx.ReadError(f"the connection broke while reading ({self.error})")
        return _ClosedError()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.eof = True


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(httpx.ReadTimeout("no data from the server within the read timeout"))


@dataclass(slots=True)
class _Timeouts:
    connect: float | None
    read: float | None
    write: float | None
    pool: float | None

    @classmethod
    def of(cls, request: httpx.Request) -> _Timeouts:
        given = request.extensions.get("timeout", {})
        return cls(given.get("connect"), given.get("read"), given.get("write"), given.get("pool"))


class Http11Transport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over asyncio, pooled per origin; at most `max_connections` requests at once."""

    def __init__(self, *, max_connections: int, ssl_context: ssl.SSLContext | None = None) -> None:
        """`ssl_context` verifies https servers (default: httpx's, certifi or `SSL_CERT_FILE`)."""
        self.max_connections = max(1, max_connections)
        """Requests under way at once at most (more wait for a slot, up to the pool timeout)."""
        self._slots = asyncio.Semaphore(self.max_connections)
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._ssl = ssl_context
        self._closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send `request` on a pooled (or new) connection; the response's body streams from it."""
        if self._closed:
            raise httpx.ConnectError("the transport is closed")
        url = request.url
        if url.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"Request URL has an unsupported protocol '{url.scheme}://'.")
        timeouts = _Timeouts.of(request)
        await self._slot(timeouts.pool)
        try:
            body = await request.aread()
            connection, head = await self._exchange(request.url, _request_head(request, body) + body, timeouts)
        except BaseException:
            self._slots.release()
            raise
        try:
            stream = _Body(self, connection, head, request.method, timeouts.read)
        except httpx.RemoteProtocolError:
            self.give_back(connection, keep=False)
            raise
        return httpx.Response(
            head.status, headers=head.headers, stream=stream, extensions={"http_version": head.version}
        )

    async def _slot(self, timeout: float | None) -> None:
        if not self._slots.locked():
            await self._slots.acquire()  # free at once: no timer to set up
            return
        try:
            async with asyncio.timeout(timeout):
                await self._slots.acquire()
        except TimeoutError:
            raise httpx.PoolTimeout("no connection came free within the pool timeout") from None

    async def _exchange(self, url: httpx.URL, data: bytes, timeouts: _Timeouts) -> tuple[_Connection, _Head]:
        """Send the request and read the response's head; a reused connection found dead is replaced once."""
        connection = await self._connection(url, timeouts.connect)
        while True:
            try:
                return connection, await _send(connection, data, timeouts)
            except (_ClosedError, httpx.ReadError, httpx.WriteError) as exc:
                connection.close()
                if not connection.reused or connection.answered:
                    raise _broken(exc) from None
            except BaseException:
                connection.close()
                raise
            # A keep-alive race: the server closed the idle connection as the request went out.
            # The new connection is not reused, so it is tried once.
            connection = await self._connect(url, timeouts.connect)

    async def _connection(self, url: httpx.URL, timeout: float | None) -> _Connection:
        idle = self._idle.get(_origin(url))
        while idle:
            connection = idle.pop()
            if connection.usable:
                connection.reused, connection.answered = True, False
                return connection
            connection.close()
        return await self._connect(url, timeout)

    async def _connect(self, url: httpx.URL, timeout: float | None) -> _Connection:
        origin = _origin(url)
        scheme, host, port = origin
        secure = scheme == "https"
        if secure and self._ssl is None:
            self._ssl = httpx.create_ssl_context()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, connection = await loop.create_connection(
                    lambda: _Connection(origin),
                    host,
                    port,
                    ssl=self._ssl if secure else None,
                    server_hostname=host if secure else None,
                )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"could not connect to {host}:{port} in time") from None
        except (OSError, ssl.SSLError) as exc:
            raise httpx.ConnectError(f"could not connect to {host}:{port}: {exc}") from None
        return connection

    def give_back(self, connection: _Connection, *, keep: bool) -> None:
        """A response is over: its slot comes free, its connection goes back to the pool if `keep`."""
        self._slots.release()
        if not keep or self._closed or not connection.usable:
            connection.close()
            return
        idle = self._idle.setdefault(connection.origin, [])
        if len(idle) >= self.max_connections:
            idle.pop(0).close()
        idle.append(connection)

    async def aclose(self) -> None:
        """Close every idle connection; a response still streaming closes its own when it ends."""
        self._closed = True
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()


def _origin(url: httpx.URL) -> tuple[str, str, int]:
    port = url.port or (443 if url.scheme == "https" else 80)
    return url.scheme, url.host, port


def _request_head(request: httpx.Request, body: bytes) -> bytes:
    """The request line and headers; a body of unknown length is sent whole with its length."""
    lines = [request.method.encode("ascii") + b" " + request.url.raw_path + b" HTTP/1.1"]
    for name, value in request.headers.raw:
        if name.lower() == b"transfer-encoding":
            continue  # the body was read whole (`aread`): it goes with a Content-Length instead
        lines.append(name + b": " + value)
    if "content-length" not in request.headers and (body or request.method in ("POST", "PUT", "PATCH")):
        lines.append(b"Content-Length: " + str(len(body)).encode("ascii"))
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def _send(connection: _Connection, data: bytes, timeouts: _Timeouts) -> _Head:
    await connection.write(data, timeouts.write)
    return await _read_head(connection, timeouts.read)


def _broken(exc: Exception) -> Exception:
    """What a request whose connection ended before the response's head raises."""
    if isinstance(exc, _ClosedError):
        return httpx.RemoteProtocolError("Server disconnected without sending a response.")
    return exc


@dataclass(frozen=True, slots=True)
class _Head:
    """A response's status line and headers."""

    version: bytes
    status: int
    headers: httpx.Headers


async def _read_head(connection: _Connection, timeout: float | None) -> _Head:
    """The response's status and headers (interim 1xx responses skipped)."""
    while True:
        buffer = connection.buffer
        end = buffer.find(b"\r\n\r\n")
        while end < 0:
            if len(buffer) > MAX_HEAD_BYTES:
                raise httpx.RemoteProtocolError(f"the response's head exceeded {MAX_HEAD_BYTES} bytes")
            await connection.fill(timeout)
            end = buffer.find(b"\r\n\r\n")
        head = bytes(buffer[:end])
        del buffer[: end + 4]
        status_line, *header_lines = head.split(b"\r\n")
        version, status = _status(status_line)
        if 100 <= status < 200 and status != 101:
            continue  # 100 Continue and the like: the real answer follows
        headers = [_header(line) for line in header_lines]
        return _Head(version, status, httpx.Headers(headers))


def _status(line: bytes) -> tuple[bytes, int]:
    parts = line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit() or len(parts[1]) != 3:
        raise httpx.RemoteProtocolError(f"malformed status line {line[:100]!r}")
    return parts[0], int(parts[1])


def _header(line: bytes) -> tuple[bytes, bytes]:
    name, colon, value = line.partition(b":")
    if not colon or not name or name != name.strip() or line[:1] in (b" ", b"\t"):
        raise httpx.RemoteProtocolError(f"malformed header line {line[:100]!r}")
    return name, value.strip()


class _Body(httpx.AsyncByteStream):
    """A response's body as it arrives; its connection goes back to the pool once read to the end."""

    def __init__(
        self,
        transport: Http11Transport,
        connection: _Connection,
        head: _Head,
        method: str,
        read: float | None,
    ) -> None:
        self._transport = transport
        self._connection: _Connection | None = connection
        self._read = read
        headers = head.headers
        self._keep = head.version == b"HTTP/1.1" and "close" not in headers.get("connection", "").lower()
        self._framing: str
        self._length = 0
        if method == "HEAD" or head.status in NO_BODY_STATUSES:
            self._framing = "length"
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self._framing = "chunked"
        elif (length := headers.get("content-length")) is not None:
            if not length.strip().isdigit():
                raise httpx.RemoteProtocolError(f"malformed Content-Length {length[:40]!r}")
            self._framing, self._length = "length", int(length)
        else:
            self._framing, self._keep = "close", False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        connection = self._connection
        if connection is None:
            raise httpx.StreamClosed()
        try:
            if self._framing == "chunked":
                pieces = _chunked(connection, self._read)
            elif self._framing == "length":
                pieces = _sized(connection, self._length, self._read)
            else:
                pieces = _until_close(connection, self._read)
            async for piece in pieces:
                yield piece
        except _ClosedError:
            self._end(keep=False)
            raise httpx.RemoteProtocolError("the server closed the connection before the body's end") from None
        except BaseException:
            self._end(keep=False)
            raise
        self._end(keep=self._keep)

    async def aclose(self) -> None:
        self._end(keep=False)  # read to its end, the body already gave its connection back

    def _end(self, *, keep: bool) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            self._transport.give_back(connection, keep=keep)


async def _piece(connection: _Connection, wanted: int, timeout: float | None) -> bytes:
    """At most `wanted` bytes of the body: what the buffer holds, or the next read's."""
    buffer = connection.buffer
    if not buffer:
        await connection.fill(timeout)
    piece = bytes(buffer[:wanted])
    del buffer[: len(piece)]
    return piece


async def _sized(connection: _Connection, length: int, timeout: float | None) -> AsyncIterator[bytes]:
    while length:
        piece = await _piece(connection, length, timeout)
        length -= len(piece)
        yield piece


async def _until_close(connection: _Connection, timeout: float | None) -> AsyncIterator[bytes]:
    buffer = connection.buffer
    while True:
        if buffer:
            piece = bytes(buffer)
            buffer.clear()
            yield piece
        try:
            await connection.fill(timeout)
        except _ClosedError:
            return


async def _chunked(connection: _Connection, timeout: float | None) -> AsyncIterator[bytes]:
    """The chunks' data as it arrives (a chunk split across reads comes in pieces), trailers skipped."""
    while True:
        size = await _chunk_size(connection, timeout)
        if size == 0:
            await _skip_trailers(connection, timeout)
            return
        while size:
            piece = await _piece(connection, size, timeout)
            size -= len(piece)
            yield piece
        await _line(connection, timeout, expect_empty=True)


async def _chunk_size(connection: _Connection, timeout: float | None) -> int:
    line = await _line(connection, timeout)
    digits = line.split(b";", 1)[0].strip()
    if not digits or len(digits) > 16 or not HEX_DIGITS.issuperset(digits):
        raise httpx.RemoteProtocolError(f"malformed chunk size {line[:40]!r}")
    return int(digits, 16)


async def _line(connection: _Connection, timeout: float | None, *, expect_empty: bool = False) -> bytes:
    buffer = connection.buffer
    end = buffer.find(b"\r\n")
    while end < 0:
        if len(buffer) > MAX_CHUNK_LINE:
            raise httpx.RemoteProtocolError("a chunk's framing line is too long")
        await connection.fill(timeout)
        end = buffer.find(b"\r\n")
    line = bytes(buffer[:end])
    del buffer[: end + 2]
    if expect_empty and line:
        raise httpx.RemoteProtocolError("a chunk did not end where its size said")
    return line


async def _skip_trailers(connection: _Connection, timeout: float | None) -> None:
    while await _line(connection, timeout):
        pass


__all__ = ["Http11Transport"]
