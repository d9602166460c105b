"""HTTP server bounds, enforced in the protocol before any request reaches the app.

uvicorn's httptools protocol (llhttp, in C: a fraction of h11's CPU per request), made to refuse
what a hostile client could use to hold memory or connections:

- a request head (request line + headers) over `max_header_bytes` is answered 431, a request
  line over `max_request_line_bytes` 414, before the rest is read: the parser is never fed more
  than the limit plus one byte of a head, so a 64 MiB header costs about the limit at most;
- a connection that sends no byte within `first_byte_timeout` is closed; a head not complete
  within `header_timeout` of its first byte (slowloris) is answered 408; a body not complete
  within `body_timeout` of its head is answered 408; an idle keep-alive connection is closed
  after `keep_alive_timeout`;
- beyond `max_connections` open connections (HTTP and WebSocket) a request is answered 503,
  a WebSocket handshake refused with a 503, both with a JSON body; `/healthz` and `/readyz`
  are still answered, so a busy ingress is not restarted for it;
- what llhttp refuses (malformed lines, bad header names or values, Content-Length together
  with Transfer-Encoding — how requests are smuggled past a proxy) is answered 400.

Every refusal is `{"error", "code"}` JSON with `Connection: close`. After it the connection
*lingers*: its write side is shut and whatever the client still sends is read and dropped
(never buffered) for a moment, so the client can read the answer instead of a reset.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, ClassVar

import httptools
import uvicorn
from uvicorn._types import ASGIReceiveCallable, ASGISendCallable, ASGISendEvent, Scope
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from atmosphere.ingress.errors import (
    BusyError,
    HeadersTooLargeError,
    IngressError,
    MalformedRequestError,
    SlowRequestError,
    UriTooLongError,
)

log = logging.getLogger("atmosphere.ingress")

TESTED_UVICORN = ((0, 50), (0, 55))
"""The uvicorn versions (major, minor) this module was tested on: from the first, up to but not including the second.

`BoundedHttpToolsProtocol` subclasses uvicorn's private httptools protocol and overrides its
parser callbacks and hooks, which any minor release may change without notice: a server is
built only on a tested version (`require_tested_uvicorn`). To move the range, run ingress's
tests on the new uvicorn, then raise this and the pin in `services/ingress/pyproject.toml`.
"""
LINGER_SECONDS = 2.0
"""How long a refused connection keeps draining what the client still sends before closing."""
_REQUEST_LINE_FRAMING = len(b"  HTTP/1.1\r\n")
_HEADER_LINE_FRAMING = len(b": \r\n")
WEBSOCKET_MAX_LINE = 8192
WEBSOCKET_MAX_HEADERS = 128
"""The `websockets` handshake parser's own limits; a handshake beyond them would hang there."""


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """The bounds one ingress process enforces on every HTTP connection."""

    max_header_bytes: int = 32 * 1024
    max_request_line_bytes: int = 8 * 1024
    first_byte_timeout: float = 10.0
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    keep_alive_timeout: float = 5.0
    max_connections: int = 4096


OVER_CAPACITY = "Too many connections to this ingress; retry shortly"
MALFORMED_HTTP = "Malformed HTTP request"


MAX_LOGGED_REASON = 200
"""Characters of a parser's reason that reach the log (it may quote what the client sent)."""


def parser_reason(exc: httptools.HttpParserError) -> str:
    """Why the parser refused a request, in one bounded line.

    A callback that raised (uvicorn's own checks) is reported by the parser as a callback error;
    what the callback raised is the reason.
    """
    cause = exc.__cause__ or exc.__context__
    reason = str(cause) if isinstance(exc, httptools.HttpParserCallbackError) and cause is not None else str(exc)
    # A URL the parser quotes (`invalid url b'/x?access_token=…'`) loses its query: it may hold a token.
    reason = _QUERY.sub("?…", reason)
    reason = " ".join(reason.split()) or type(exc).__name__
    return reason[:MAX_LOGGED_REASON]


_QUERY = re.compile(r"\?[^'\"\s]*")
"""A query string as a parser's reason quotes it: up to the closing quote or a space."""


def refusal(error: IngressError) -> bytes:
    """A complete HTTP/1.1 answer with `error`'s JSON body and status, closing the connection."""
    body = json.dumps(error.body()).encode()
    head = (
        f"HTTP/1.1 {error.status} {HTTPStatus(error.status).phrase}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


PROBE_PATHS = frozenset({"/healthz", "/readyz"})
"""Answered even over the connection cap: a kubelet must not restart an ingress for being busy."""


def over_capacity(app: Any) -> Any:
    """The app a connection over the cap is served by: the probes as usual, anything else 503."""

    async def gate(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope.get("type") == "http" and scope.get("path") in PROBE_PATHS:
            await app(scope, receive, send)
        else:
            await refuse_over_capacity(scope, receive, send)

    return gate


async def refuse_over_capacity(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
    """503, JSON, then close."""
    busy = BusyError(OVER_CAPACITY)
    body = json.dumps(busy.body())
    await send(
        {
            "type": "http.response.start",
            "status": busy.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", b"1"),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body.encode(), "more_body": False})


class _RefusedError(Exception):
    """Raised from a parser callback to stop parsing a request that is refused."""


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with head limits, deadlines, a connection cap and JSON refusals.

    Use `bounded_protocol(limits)` for a class bound to a set of limits (uvicorn instantiates
    the class itself).

    Head sizes are measured twice, for two reasons: the parser callbacks add up the request line
    and each header as they complete (exact, also for a head that arrives whole in one read),
    and `data_received` feeds the parser at most the limit plus one byte of an unfinished head
    (bounded memory: httptools buffers a header's name and value until the header is complete).
    """

    limits: ClassVar[HttpLimits] = HttpLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.limits.keep_alive_timeout  # type: ignore[assignment]
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_for: str = ""
        self._lingering = False
        self._upgraded = False
        self._over_capacity = False
        self._refusal: IngressError | None = None
        self._in_head = True
        """Between requests or inside a head: what arrives is head bytes."""
        self._head_fed = 0
        """Bytes of the current unfinished head fed to the parser (a lower bound)."""
        self._head_size = 0
        """The current head's size as the parser callbacks report it."""
        self._head_restarted = False
        self._close_after_response = False
        """The answer being sent said `connection: close`: once it is sent, linger and close."""

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._over_capacity = len(self.connections) > self.limits.max_connections
        if self._over_capacity:
            self.app = over_capacity(self.app)
        self._arm("first-byte", self.limits.first_byte_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # a refused client's leftovers: read and dropped, never buffered
        self._unset_keepalive_if_required()
        limit = self.limits.max_header_bytes
        while data and not self._lingering and not self._upgraded and self.parser is not None:
            if self._in_head:
                if self._deadline_for in {"", "first-byte"}:
                    self._arm("header", self.limits.header_timeout)
                room = limit + 1 - self._head_fed
                piece, data = data[:room], data[room:]
            else:
                piece, data = data, b""
            was_in_head, self._head_restarted = self._in_head, False
            if not self._feed(piece):
                return
            if was_in_head and self._in_head and not self._head_restarted:
                self._head_fed += len(piece)  # all of it was head: still unfinished
                if self._head_fed > limit:
                    self._refuse_large_head()
                    return

    def shutdown(self) -> None:
        if self._lingering:
            self.transport.close()
            return
        super().shutdown()

    # -- parsing ------------------------------------------------------------------------------

    def _feed(self, data: bytes) -> bool:
        """Feed `data` to the parser; False when the connection is done with (refused, upgraded)."""
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return False
        except httptools.HttpParserError as exc:
            refusal, self._refusal = self._refusal, None
            if refusal is None:
                # Malformed HTTP as llhttp sees it, or a request uvicorn cannot use (a non-ASCII
                # path). One line with the reason: a client's garbage is no bug of ours, and a
                # scanner must not be able to fill the log with stack traces.
                log.info("refused a malformed HTTP request from %s: %s", self._peer(), parser_reason(exc))
                refusal = MalformedRequestError(MALFORMED_HTTP)
            self._refuse(refusal)
            return False
        return True

    def _peer(self) -> str:
        host, port = self.client or ("?", 0)
        return f"{host}:{port}"

    def _stop_parsing(self, refusal: IngressError) -> None:
        self._refusal = refusal
        raise _RefusedError(refusal.message)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_size = 0

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > self.limits.max_request_line_bytes:
            self._stop_parsing(self._long_request_line())

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value) + _HEADER_LINE_FRAMING
        if self._head_size + len(self.url) > self.limits.max_header_bytes:
            self._stop_parsing(self._large_head())
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        head = len(self.parser.get_method()) + len(self.url) + _REQUEST_LINE_FRAMING + self._head_size + 2
        if head > self.limits.max_header_bytes:
            self._stop_parsing(self._large_head())
        self._disarm()
        self._in_head, self._head_fed = False, 0
        self._arm("body", self.limits.body_timeout)
        before = self.cycle
        super().on_headers_complete()
        if self.cycle is not None and self.cycle is not before:  # a new request (not an upgrade)
            self._close_if_answered_early(self.cycle)

    def on_message_complete(self) -> None:
        if self._deadline_for == "body":
            self._disarm()
        self._in_head, self._head_fed, self._head_restarted = True, 0, True
        super().on_message_complete()

    # -- uvicorn hooks ------------------------------------------------------------------------

    def handle_websocket_upgrade(self) -> None:
        self._disarm()
        if self._over_capacity:
            self._refuse(BusyError(OVER_CAPACITY))
            return
        if too_big := self._websocket_head_too_big():
            self._refuse(HeadersTooLargeError(too_big))
            return
        self._upgraded = True
        super().handle_websocket_upgrade()

    def send_400_response(self, msg: str) -> None:
        self._refuse(MalformedRequestError(MALFORMED_HTTP))

    def on_response_complete(self) -> None:
        super().on_response_complete()
        close, self._close_after_response = self._close_after_response, False
        if close and not self.transport.is_closing():
            # Answered before the body was read (413, 401...): drain a little, then close, rather
            # than read an unbounded body nobody will use.
            self._linger()

    def _close_if_answered_early(self, cycle: RequestResponseCycle) -> None:
        """Make an answer that starts before its request's body is read say `connection: close`.

        Without it the client, told nothing, sends its next request on a connection this side is
        about to close (see `on_response_complete`): that request is lost to a disconnect. The
        close itself stays ours (uvicorn would close at once, and a client still sending its body
        would get a reset instead of the answer).
        """
        send = cycle.send

        async def send_closing_early(message: ASGISendEvent) -> None:
            if message["type"] != "http.response.start" or not cycle.more_body:
                await send(message)
                return
            headers = [(name, value) for name, value in message.get("headers", []) if name.lower() != b"connection"]
            await send({**message, "headers": [*headers, (b"connection", b"close")]})
            cycle.keep_alive = True  # the answer says close; the lingering close comes after it
            self._close_after_response = True

        cycle.send = send_closing_early  # type: ignore[method-assign]

    # -- deadlines ----------------------------------------------------------------------------

    def _arm(self, what: str, seconds: float) -> None:
        self._disarm()
        self._deadline_for = what
        self._deadline = self.loop.call_later(seconds, self._expired, what)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = None
        self._deadline_for = ""

    def _expired(self, what: str) -> None:
        self._deadline = None
        self._deadline_for = ""
        if self.transport.is_closing():
            return
        if what in {"first-byte", "linger"}:
            self.transport.close()  # nothing was asked (or it was answered): nothing to say
        elif what == "body" and self.cycle is not None and self.cycle.response_started:
            self.transport.close()  # the app already answers; a 408 cannot follow its head
        else:
            self._refuse(SlowRequestError(f"The request {what} did not arrive in time"))

    # -- refusals -----------------------------------------------------------------------------

    def _refuse(self, error: IngressError) -> None:
        if self.transport.is_closing():
            return
        self.transport.write(refusal(error))
        self._linger()

    def _long_request_line(self) -> UriTooLongError:
        return UriTooLongError(f"The request line exceeds {self.limits.max_request_line_bytes} bytes")

    def _large_head(self) -> HeadersTooLargeError:
        return HeadersTooLargeError(f"The request headers exceed {self.limits.max_header_bytes} bytes")

    def _refuse_large_head(self) -> None:
        # No header has completed yet and the URL is still open: it is the request line that is long.
        long_line = self._head_size == 0 and len(getattr(self, "url", b"")) >= self.limits.max_request_line_bytes
        self._refuse(self._long_request_line() if long_line else self._large_head())

    def _linger(self) -> None:
        self._lingering = True
        self._unset_keepalive_if_required()
        if self.cycle is not None and not self.cycle.response_complete:
            # The app (if any) sees a disconnect: it must not answer on top of the refusal.
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.flow.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._arm("linger", LINGER_SECONDS)

    def _websocket_head_too_big(self) -> str:
        if len(self.url) + len(self.scope["method"]) + 10 > WEBSOCKET_MAX_LINE:
            return f"A WebSocket request line must stay under {WEBSOCKET_MAX_LINE} bytes"
        if len(self.headers) > WEBSOCKET_MAX_HEADERS:
            return f"A WebSocket handshake may carry at most {WEBSOCKET_MAX_HEADERS} headers"
        if any(len(name) + len(value) + 4 > WEBSOCKET_MAX_LINE for name, value in self.headers):
            return f"A WebSocket handshake header line must stay under {WEBSOCKET_MAX_LINE} bytes"
        return ""


class UntestedUvicornError(RuntimeError):
    """The installed uvicorn is not one `BoundedHttpToolsProtocol` was tested on."""


def require_tested_uvicorn() -> None:
    """Pass when the installed uvicorn is within `TESTED_UVICORN`, else raise `UntestedUvicornError`.

    Refused rather than warned: on an untested uvicorn the bounds may silently stop holding.
    """
    installed = uvicorn.__version__
    (low_major, low_minor), (high_major, high_minor) = TESTED_UVICORN
    tested = f">={low_major}.{low_minor},<{high_major}.{high_minor}"
    found = re.match(r"(\d+)\.(\d+)", installed)
    if found is None or not TESTED_UVICORN[0] <= (int(found[1]), int(found[2])) < TESTED_UVICORN[1]:
        msg = (
            f"uvicorn {installed} is not a version ingress was tested on ({tested}): its HTTP limits "
            "(atmosphere.ingress.limits) subclass uvicorn's private httptools protocol. Install a tested "
            "uvicorn, or run ingress's tests on this one and raise TESTED_UVICORN and the pin in "
            "services/ingress/pyproject.toml."
        )
        raise UntestedUvicornError(msg)


def bounded_protocol(limits: HttpLimits) -> type[BoundedHttpToolsProtocol]:
    """A `BoundedHttpToolsProtocol` class bound to `limits`, for `uvicorn.Config(http=...)`.

    Refused (`UntestedUvicornError`) on a uvicorn outside `TESTED_UVICORN`.
    """
    require_tested_uvicorn()
    return type("IngressHttpProtocol", (BoundedHttpToolsProtocol,), {"limits": limits})
