"""HTTP server bounds, enforced in the protocol before any request reaches the app.

uvicorn's h11 protocol, made to refuse what a hostile client could use to hold memory or
connections:

- a request head (request line + headers) over `max_header_bytes` is answered 431, a request
  line over `max_request_line_bytes` 414, before the rest is read: h11 never buffers more than
  the limit plus one socket read, so a 64 MiB header costs a few hundred KiB at most;
- a connection that sends no byte within `first_byte_timeout` is closed; a head not complete
  within `header_timeout` of its first byte (slowloris) is answered 408; a body not complete
  within `body_timeout` of its head is answered 408; an idle keep-alive connection is closed
  after `keep_alive_timeout`;
- beyond `max_connections` open connections (HTTP and WebSocket) a request is answered 503,
  a WebSocket handshake refused with a 503, both with a JSON body; `/healthz` and `/readyz`
  are still answered, so a busy ingress is not restarted for it.

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

import h11
from uvicorn._types import ASGIReceiveCallable, ASGISendCallable, Scope
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("atmosphere.ingress")

LINGER_SECONDS = 2.0
"""How long a refused connection keeps draining what the client still sends before closing."""
HEAD_END = re.compile(rb"\n\r?\n")
"""Where a request head ends (h11 accepts bare LF line ends too)."""
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


def refusal(status: int, message: str, code: str) -> bytes:
    """A complete HTTP/1.1 answer with an ingress JSON error body, closing the connection."""
    body = json.dumps({"error": message, "code": code}).encode()
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
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
    body = json.dumps({"error": "Too many connections to this ingress; retry shortly", "code": "ingress.busy"})
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", b"1"),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body.encode(), "more_body": False})


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with head limits, deadlines, a connection cap and JSON refusals.

    Use `bounded_protocol(limits)` for a class bound to a set of limits (uvicorn instantiates
    the class itself).
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
        if self._deadline_for in {"", "first-byte"} and self.conn.their_state is h11.IDLE:
            self._arm("header", self.limits.header_timeout)
        self.conn.receive_data(data)
        if self.conn.their_state is h11.IDLE and self._head_refused():
            return
        self.handle_events()

    def shutdown(self) -> None:
        if self._lingering:
            self.transport.close()
            return
        super().shutdown()

    # -- uvicorn hooks ------------------------------------------------------------------------

    def handle_events(self) -> None:
        before = self.cycle
        try:
            super().handle_events()
        except Exception:  # a request h11 took but uvicorn cannot use (e.g. a non-ASCII path)
            log.info("refused an unusable HTTP request", exc_info=True)
            self._refuse(400, "Malformed HTTP request", "bad_request")
            return
        if self._upgraded or self._lingering or self.transport.is_closing():
            return
        if self.cycle is not before and _ambiguous_length(self.headers):
            # Both framings at once is how requests are smuggled past a proxy: refuse, never guess.
            self._refuse(400, "Content-Length and Transfer-Encoding must not both be sent", "bad_request")
            return
        self._follow_request_state()

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._disarm()
        if self._over_capacity:
            self._refuse(503, "Too many connections to this ingress; retry shortly", "busy")
            return
        if too_big := self._websocket_head_too_big(event):
            self._refuse(431, too_big, "headers_too_large")
            return
        self._upgraded = True
        super().handle_websocket_upgrade(event)

    def send_400_response(self, msg: str) -> None:
        # h11 refused the request: a head past `max_header_bytes`, or malformed HTTP.
        buffered, _ = self.conn.trailing_data
        if len(buffered) <= self.limits.max_header_bytes:
            self._refuse(400, "Malformed HTTP request", "bad_request")
        elif b"\n" not in buffered[: self.limits.max_request_line_bytes]:
            self._refuse_long_request_line()
        else:
            self._refuse(431, f"The request headers exceed {self.limits.max_header_bytes} bytes", "headers_too_large")

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
            # Answered before the body was read (413, 401...): drain a little, then close, rather
            # than read an unbounded body nobody will use.
            self._linger()

    # -- deadlines ----------------------------------------------------------------------------

    def _follow_request_state(self) -> None:
        state = self.conn.their_state
        if state is h11.SEND_BODY and self._deadline_for != "body":
            self._arm("body", self.limits.body_timeout)
        elif state is not h11.SEND_BODY and state is not h11.IDLE and self._deadline_for in {"header", "body"}:
            self._disarm()

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
            self._refuse(408, f"The request {what} did not arrive in time", "request_timeout")

    # -- refusals -----------------------------------------------------------------------------

    def _refuse(self, status: int, message: str, code: str) -> None:
        if self.transport.is_closing():
            return
        self.transport.write(refusal(status, message, f"ingress.{code}"))
        self._linger()

    def _refuse_long_request_line(self) -> None:
        self._refuse(414, f"The request line exceeds {self.limits.max_request_line_bytes} bytes", "uri_too_long")

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

    def _head_refused(self) -> bool:
        # h11 checks its buffer only while it waits for more, so a whole oversized head that came
        # in one read would pass: measure the head here, before h11 parses it.
        buffered, _ = self.conn.trailing_data
        limits = self.limits
        line_end = buffered.find(b"\n", 0, limits.max_request_line_bytes + 2)
        if line_end == -1 and len(buffered) > limits.max_request_line_bytes:
            self._refuse_long_request_line()
            return True
        if len(buffered) > limits.max_header_bytes and not HEAD_END.search(buffered, 0, limits.max_header_bytes + 4):
            self._refuse(431, f"The request headers exceed {limits.max_header_bytes} bytes", "headers_too_large")
            return True
        return False

    def _websocket_head_too_big(self, event: h11.Request) -> str:
        if len(event.target) + len(event.method) + 10 > WEBSOCKET_MAX_LINE:
            return f"A WebSocket request line must stay under {WEBSOCKET_MAX_LINE} bytes"
        if len(event.headers) > WEBSOCKET_MAX_HEADERS:
            return f"A WebSocket handshake may carry at most {WEBSOCKET_MAX_HEADERS} headers"
        if any(len(name) + len(value) + 4 > WEBSOCKET_MAX_LINE for name, value in event.headers):
            return f"A WebSocket handshake header line must stay under {WEBSOCKET_MAX_LINE} bytes"
        return ""


def _ambiguous_length(headers: list[tuple[bytes, bytes]] | None) -> bool:
    names = {name for name, _ in headers or ()}
    return b"content-length" in names and b"transfer-encoding" in names


def bounded_protocol(limits: HttpLimits) -> type[BoundedH11Protocol]:
    """A `BoundedH11Protocol` class bound to `limits`, for `uvicorn.Config(http=...)`."""
    return type("IngressH11Protocol", (BoundedH11Protocol,), {"limits": limits})
