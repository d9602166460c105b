"""Typed errors of the bus, and the base class for services' own errors.

    BusError
     ├── ConnectError              the first connection to NATS did not succeed in time
     ├── RequestTimeoutError       no reply within the timeout (also a TimeoutError)
     ├── NoRespondersError         nobody subscribes to the subject
     ├── DecodeError               bytes that are not the expected protobuf (also a ValueError)
     ├── PayloadTooLargeError      payload + headers exceed the broker's `max_payload` (also a ValueError)
     ├── ConnectionLostError       the connection closed for good; the service must restart
     ├── NoStreamError             no JetStream stream captures the subject (a setup error: not retried)
     └── RemoteError               the responder answered with an `Error{code, message, retryable}`

    ServiceError                   raised by a handler; the router turns it into an `Error` reply

Handlers of JetStream work items may raise `Nak` (redeliver later) or `Term` (never redeliver);
the consumer runtime catches both, they never reach a caller.
"""

from __future__ import annotations

from typing import ClassVar


class BusError(Exception):
    """Base class of every error raised by `atmosphere.bus`."""


class ConnectError(BusError):
    """The first connection to NATS did not succeed within the connect timeout."""


class RequestTimeoutError(BusError, TimeoutError):
    """No reply arrived within the request timeout."""

    def __init__(self, subject: str, timeout: float) -> None:
        self.subject = subject
        self.timeout = timeout
        super().__init__(f"no reply on {subject!r} within {timeout:g}s")


class NoRespondersError(BusError):
    """No service subscribes to the subject a request was sent to."""

    def __init__(self, subject: str) -> None:
        self.subject = subject
        super().__init__(f"no responders on {subject!r}")


class DecodeError(BusError, ValueError):
    """A payload could not be decoded as the expected protobuf message."""

    def __init__(self, expected: str, reason: str) -> None:
        self.expected = expected
        self.reason = reason
        super().__init__(f"cannot decode {expected}: {reason}")


class PayloadTooLargeError(BusError, ValueError):
    """A message would exceed the broker's `max_payload`, counted as the broker counts it.

    Raised before anything is sent: nats-server closes a connection that sends an oversized
    message (and nats-py then stays closed), so the check runs on this side, with the headers.
    """

    code: ClassVar[str] = "bus.payload_too_large"

    def __init__(self, subject: str, size: int, limit: int) -> None:
        self.subject = subject
        self.size = size
        self.limit = limit
        super().__init__(f"a message of {size} bytes on {subject!r} exceeds the broker's limit of {limit} bytes")


class ConnectionLostError(BusError):
    """The connection to NATS closed for good (not by us); only a new process can recover."""


class NoStreamError(BusError):
    """No JetStream stream captures the subject: the layout is not provisioned (never retried)."""

    def __init__(self, subject: str) -> None:
        self.subject = subject
        super().__init__(f"no stream captures {subject!r}")


class RemoteError(BusError):
    """The responder answered with an `Error`; branch on `code`, not on `message`."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        retryable: bool = False,
        details: dict[str, str] | None = None,
    ) -> None:
        self.code = code
        self.message = message
        self.retryable = retryable
        self.details = dict(details or {})
        super().__init__(f"{code}: {message}")


class ServiceError(Exception):
    """A domain error a handler raises to answer with a typed `Error` reply.

    Subclasses set `code` and `retryable` as class attributes, e.g.
    `class UnknownAgent(ServiceError): code = "dispatch.unknown_agent"`.
    """

    code: ClassVar[str] = "service.error"
    retryable: ClassVar[bool] = False

    def __init__(self, message: str, *, details: dict[str, str] | None = None) -> None:
        self.message = message
        self.details = dict(details or {})
        super().__init__(message)


class Nak(Exception):  # noqa: N818 - a control-flow signal, named for the JetStream verb
    """Raised by a work-item handler: redeliver the message after `delay` seconds."""

    def __init__(self, delay: float = 1.0) -> None:
        self.delay = delay
        super().__init__(f"nak, redeliver in {delay:g}s")


class Term(Exception):  # noqa: N818 - a control-flow signal, named for the JetStream verb
    """Raised by a work-item handler: the message is poison, never redeliver it."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"term: {reason}")
