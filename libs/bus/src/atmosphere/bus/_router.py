"""Request handlers keyed by subject, and the one function that runs them for every backend."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message

from atmosphere.bus import telemetry
from atmosphere.bus._codec import Headers, decode, encode
from atmosphere.bus.errors import DecodeError, ServiceError, ServiceFailedError, UndecodableMessageError

M = TypeVar("M", bound=Message)

log = logging.getLogger("atmosphere.bus")


@dataclass(frozen=True, slots=True)
class MessageContext:
    """What a handler knows about the message besides its payload."""

    subject: str
    """The logical subject (without the bus namespace)."""
    headers: Headers


Handler = Callable[[M, MessageContext], Awaitable[Message | None]]


@dataclass(frozen=True, slots=True)
class Route(Generic[M]):
    """One subject served by one handler."""

    subject: str
    request_type: type[M]
    handler: Handler[M]


class Router:
    """Handlers for request/reply and plain subjects, registered explicitly."""

    def __init__(self) -> None:
        """Start with no routes."""
        self._routes: list[Route[Any]] = []

    @property
    def routes(self) -> tuple[Route[Any], ...]:
        """The registered routes, in registration order."""
        return tuple(self._routes)

    def add(self, subject: str, request_type: type[M], handler: Handler[M]) -> None:
        """Serve `subject` with `handler`; payloads are decoded as `request_type`."""
        if any(r.subject == subject for r in self._routes):
            msg = f"subject {subject!r} is already routed"
            raise ValueError(msg)
        self._routes.append(Route(subject, request_type, handler))

    def route(self, subject: str, request_type: type[M]) -> Callable[[Handler[M]], Handler[M]]:
        """Decorator form of `add`."""

        def register(handler: Handler[M]) -> Handler[M]:
            self.add(subject, request_type, handler)
            return handler

        return register

    def include(self, other: Router) -> None:
        """Add every route of `other`."""
        for r in other.routes:
            self.add(r.subject, r.request_type, r.handler)


async def run_route(
    route: Route[Any],
    subject: str,
    data: bytes,
    wire_headers: Mapping[str, str] | None,
) -> tuple[bytes, dict[str, str] | None] | None:
    """Decode, call the handler and encode its reply (or a typed `Error`).

    A `ServiceError` becomes an `Error` with its code; any other exception becomes
    `code="internal"` with a generic message: its text and traceback stay in the log.
    """
    try:
        request = decode(data, wire_headers, route.request_type)
    except DecodeError as exc:
        return encode(UndecodableMessageError(str(exc)).to_proto())
    headers = Headers.from_wire(wire_headers)
    context = MessageContext(subject=subject, headers=headers)
    tracer = telemetry.tracer()
    # The run the request serves names the handler's log lines; its trace parents the handler's span.
    with (
        telemetry.bind_run(headers.run_id, headers.agent),
        tracer.server_span(subject, headers.traceparent) if tracer is not None else contextlib.nullcontext(),
    ):
        started = time.perf_counter()
        try:
            reply = await route.handler(request, context)
        except ServiceError as exc:
            _handled(subject, started, exc.code)
            return encode(exc.to_proto())
        except Exception:
            log.exception("handler for %s failed", subject)
            return encode(ServiceFailedError("internal error").to_proto())
        _handled(subject, started, "")
    if reply is None:
        return None
    return encode(reply)


def _handled(subject: str, started: float, error: str) -> None:
    """One DEBUG line per handled request of a run: which, how long, how it ended (its run is bound)."""
    if telemetry.current_run() is not None and log.isEnabledFor(logging.DEBUG):
        elapsed = (time.perf_counter() - started) * 1000
        log.debug("handled %s in %.1f ms%s", telemetry.subject_family(subject), elapsed, f" ({error})" if error else "")
