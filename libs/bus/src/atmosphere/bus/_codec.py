"""Protobuf payloads and the headers that travel with them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TypeVar

from google.protobuf.message import DecodeError as _ProtobufDecodeError
from google.protobuf.message import Message

from atmosphere.bus import telemetry
from atmosphere.bus.errors import (
    DecodeError,
    PayloadTooLargeError,
    RemoteError,
    ReplyTooLargeError,
    ServiceError,
    UndecodableMessageError,
)
from atmosphere.contracts.common.v1.common_pb2 import Error

M = TypeVar("M", bound=Message)

TYPE_HEADER = "atmo-type"
TRACEPARENT_HEADER = "traceparent"
RUN_HEADER = "atmo-run"
AGENT_HEADER = "atmo-agent"
MSG_ID_HEADER = "Nats-Msg-Id"
EXPECTED_LAST_SUBJECT_SEQ_HEADER = "Nats-Expected-Last-Subject-Sequence"

_ERROR_TYPE = Error.DESCRIPTOR.full_name

DEFAULT_MAX_PAYLOAD = 1 << 20
"""nats-server's default `max_payload` (1 MiB), until the server says otherwise."""

_HEADER_BLOCK_FRAMING = len(b"NATS/1.0\r\n") + len(b"\r\n")
_HEADER_LINE_FRAMING = len(b": \r\n")


@dataclass(frozen=True, slots=True)
class Headers:
    """The headers the system understands. Unknown headers are ignored."""

    traceparent: str = ""
    """W3C trace context, passed through untouched."""
    run_id: str = ""
    """`atmo-run`: the run a request serves (`atmosphere.bus.telemetry`), so its handler's logs name it."""
    agent: str = ""
    """`atmo-agent`: that run's agent."""
    msg_id: str = ""
    """`Nats-Msg-Id`: JetStream de-duplicates messages with the same id."""
    expected_last_subject_seq: int | None = None
    """`Nats-Expected-Last-Subject-Sequence`: JetStream stores the message only if the newest one
    on its subject has this stream sequence (0: the subject holds none) — a compare-and-set that
    lets exactly one writer append to a subject (`WrongLastSequenceError` for the others)."""

    def with_msg_id(self, msg_id: str) -> Headers:
        """A copy with another `Nats-Msg-Id`."""
        return replace(self, msg_id=msg_id)

    def to_wire(self, message_type: str | None = None) -> dict[str, str]:
        """The NATS header map; `message_type` (the payload's full name) is sent if given.

        Only `Error` replies name their type: a subject already says what it carries, and
        headers cost time on every message (a header block turns PUB into HPUB and must be
        parsed on the other side), so a message with nothing to say sends none.
        """
        wire: dict[str, str] = {}
        if message_type:
            wire[TYPE_HEADER] = message_type
        if self.traceparent:
            wire[TRACEPARENT_HEADER] = self.traceparent
        if self.run_id:
            wire[RUN_HEADER] = self.run_id
            if self.agent:
                wire[AGENT_HEADER] = self.agent
        if self.msg_id:
            wire[MSG_ID_HEADER] = self.msg_id
        if self.expected_last_subject_seq is not None:
            wire[EXPECTED_LAST_SUBJECT_SEQ_HEADER] = str(self.expected_last_subject_seq)
        return wire

    @classmethod
    def from_wire(cls, wire: Mapping[str, str] | None) -> Headers:
        """Parse a NATS header map."""
        if not wire:
            return cls()
        return cls(
            traceparent=wire.get(TRACEPARENT_HEADER, ""),
            run_id=wire.get(RUN_HEADER, ""),
            agent=wire.get(AGENT_HEADER, ""),
            msg_id=wire.get(MSG_ID_HEADER, ""),
        )

    def for_request(self) -> Headers:
        """These headers plus what the current task's run and span put on its requests.

        A value already set is kept (a caller continuing another run's trace says so).
        """
        run = telemetry.current_run()
        tracer = telemetry.tracer()
        traceparent = self.traceparent or (tracer.traceparent() if tracer is not None else "")
        if run is None and traceparent == self.traceparent:
            return self
        # Built directly, not with `replace` (several times slower): this runs for every request.
        return Headers(
            traceparent=traceparent,
            run_id=self.run_id or (run.run_id if run else ""),
            agent=self.agent or (run.agent if run else ""),
            msg_id=self.msg_id,
            expected_last_subject_seq=self.expected_last_subject_seq,
        )


_NO_HEADERS = Headers()


def encode(message: Message, headers: Headers | None = None) -> tuple[bytes, dict[str, str] | None]:
    """Serialize `message` and build its header map (None when there is nothing to send).

    An `Error` always carries its type, so the receiver can tell it from the expected reply.
    """
    full_name = message.DESCRIPTOR.full_name
    wire = (headers or _NO_HEADERS).to_wire(full_name if full_name == _ERROR_TYPE else None)
    return message.SerializeToString(), wire or None


def wire_size(payload: bytes, wire_headers: Mapping[str, str] | None) -> int:
    """The size the broker counts against `max_payload`: the payload plus the header block.

    The block is a `NATS/1.0` line, one `key: value` line per header and an empty line (each
    ending in CRLF), as nats-py writes it; the subject and reply subject do not count.
    """
    if not wire_headers:
        return len(payload)
    lines = sum(
        len(key.strip().encode()) + len(value.strip().encode()) + _HEADER_LINE_FRAMING
        for key, value in wire_headers.items()
        if key.strip()
    )
    return len(payload) + _HEADER_BLOCK_FRAMING + lines


def check_size(subject: str, payload: bytes, wire_headers: Mapping[str, str] | None, limit: int) -> None:
    """Raise `PayloadTooLargeError` when the message would exceed `limit` on the wire."""
    size = wire_size(payload, wire_headers)
    if size > limit:
        raise PayloadTooLargeError(subject, size, limit)


def decode(data: bytes, wire_headers: Mapping[str, str] | None, expected: type[M]) -> M:
    """Parse `data` as `expected`.

    Raises:
        RemoteError: the payload is an `Error` reply.
        DecodeError: the payload is another type, or not valid protobuf.
    """
    full_name = expected.DESCRIPTOR.full_name
    sent_type = (wire_headers or {}).get(TYPE_HEADER, "")
    if sent_type == _ERROR_TYPE and full_name != _ERROR_TYPE:
        raise error_from_payload(data)
    if sent_type and sent_type != full_name:
        raise DecodeError(full_name, f"payload is a {sent_type}")
    try:
        return expected.FromString(data)
    except _ProtobufDecodeError as exc:
        raise DecodeError(full_name, str(exc)) from exc


def error_reply_too_large(exc: PayloadTooLargeError) -> tuple[bytes, dict[str, str] | None]:
    """The `Error` reply sent instead of an answer too large for the broker."""
    error = ReplyTooLargeError(
        "The answer is too large to send over the bus", details={"size": str(exc.size), "limit": str(exc.limit)}
    )
    return encode(error.to_proto())


def error_from_payload(data: bytes) -> RemoteError:
    """Turn an `Error` payload into the `RemoteError` a caller sees."""
    try:
        err = Error.FromString(data)
    except _ProtobufDecodeError:
        return RemoteError(UndecodableMessageError("malformed error reply"))
    return RemoteError(ServiceError.from_proto(err))
