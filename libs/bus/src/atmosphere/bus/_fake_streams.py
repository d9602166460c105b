"""JetStream in memory, under `atmosphere.bus.testing.FakeBus`: streams, their messages and durable consumers.

A stream captures the subjects of its spec and de-duplicates by `Nats-Msg-Id`; a durable
consumer's state (what it handed out, what waits to be delivered again) is shared by every
worker pulling from it (`_fake_workers`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from google.protobuf.message import Message

from atmosphere.bus._api import ConsumerState, Envelope, PublishAck
from atmosphere.bus._codec import Headers, decode
from atmosphere.bus._jetstream import ConsumerSpec, JetStreamLayout, RequiredLayout, Retention, StreamSpec
from atmosphere.bus._provisioning import LayoutNotProvisionedError
from atmosphere.bus.errors import BusError, DecodeError
from atmosphere.bus.subjects import matches, overlaps

M = TypeVar("M", bound=Message)

log = logging.getLogger("atmosphere.bus")


@dataclass
class Stored:
    """A message a stream holds."""

    seq: int
    subject: str
    data: bytes
    headers: Mapping[str, str] | None


@dataclass
class Stream:
    """A stream: its spec, the messages it holds, and the ids it de-duplicates by."""

    spec: StreamSpec
    messages: dict[int, Stored] = field(default_factory=dict)
    msg_ids: dict[str, int] = field(default_factory=dict)
    last_seq: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def wake(self) -> None:
        """Wake every worker waiting for a message."""
        self.changed.set()


@dataclass
class Durable:
    """Server-side state of a durable consumer, shared by every worker pulling from it."""

    spec: ConsumerSpec
    cursor: int = 0
    """The last stream sequence handed out for the first time."""
    redeliver: list[int] = field(default_factory=list)
    delivered: dict[int, int] = field(default_factory=dict)
    """Delivery counts of messages not yet acked or terminated."""


class FakeStreams:
    """The streams and durable consumers of one `FakeBus`, and what it reads from them."""

    def __init__(self) -> None:
        """No streams and no consumers until a layout is provisioned."""
        self.streams: dict[str, Stream] = {}
        self.durables: dict[tuple[str, str], Durable] = {}

    def provision_streams(self, layout: JetStreamLayout) -> None:
        """Create or update the streams of `layout`; one whose subjects overlap another's is refused."""
        for spec in layout.streams():
            for other in self.streams.values():
                if other.spec.name != spec.name and any(
                    overlaps(a, b) for a in spec.subjects for b in other.spec.subjects
                ):
                    msg = f"stream {spec.name} overlaps {other.spec.name}"
                    raise BusError(msg)
            existing = self.streams.get(spec.name)
            if existing is None:
                self.streams[spec.name] = Stream(spec)
            else:
                existing.spec = spec

    def provision_consumers(self, layout: JetStreamLayout) -> None:
        """Create or update the durable consumers of `layout` (as the provisioner, which may)."""
        for consumer in layout.consumers:
            self.durable(dataclasses.replace(consumer, provisioned=False))

    def missing_streams(self, required: RequiredLayout) -> list[str]:
        """What `required` names of streams that does not exist."""
        return [f"{s} does not exist" for s in required.streams if s not in self.streams]

    def missing_consumers(self, required: RequiredLayout) -> list[str]:
        """What `required` names of durable consumers that does not exist."""
        return [
            f"consumer {c.durable} of {c.stream} does not exist"
            for c in required.consumers
            if (c.stream, c.durable) not in self.durables
        ]

    def capturing(self, subject: str) -> Stream | None:
        """The stream whose subjects match `subject`, if any (provisioning keeps them from overlapping)."""
        for stream in self.streams.values():
            if any(matches(p, subject) for p in stream.spec.subjects):
                return stream
        return None

    @staticmethod
    def last_seq_of(stream: Stream, subject: str) -> int:
        """The sequence of the newest message of `subject` in `stream` (0: none)."""
        return max((seq for seq, stored in stream.messages.items() if stored.subject == subject), default=0)

    def store(self, stream: Stream, subject: str, data: bytes, headers: Mapping[str, str] | None) -> PublishAck:
        """Store a message in `stream`, once per `Nats-Msg-Id`, and wake the workers waiting on it."""
        msg_id = (headers or {}).get("Nats-Msg-Id", "")
        if msg_id in stream.msg_ids:
            return PublishAck(stream.spec.name, stream.msg_ids[msg_id], duplicate=True)
        stream.last_seq += 1
        if msg_id:
            stream.msg_ids[msg_id] = stream.last_seq
        stream.messages[stream.last_seq] = Stored(stream.last_seq, subject, data, headers)
        stream.wake()
        return PublishAck(stream.spec.name, stream.last_seq, duplicate=False)

    async def consumer_state(self, stream: str, durable: str) -> ConsumerState:
        """Unacknowledged messages (not yet handed out, redelivering, in hand) and the ack floor."""
        found = self.durables.get((stream, durable))
        if found is None:
            msg = f"consumer {durable!r} of {stream!r} not found"
            raise BusError(msg)
        messages = self.streams[stream].messages
        waiting = [
            seq for seq, m in messages.items() if seq > found.cursor and matches(found.spec.filter_subject, m.subject)
        ]
        unacked = sorted({*waiting, *found.redeliver, *found.delivered})
        floor = unacked[0] - 1 if unacked else max(messages, default=0)
        return ConsumerState(pending=len(unacked), ack_floor=floor)

    async def stream_last_seq(self, stream: str) -> int:
        """The newest message's sequence in `stream` (0 when it holds none)."""
        if stream not in self.streams:
            msg = f"stream {stream!r} is not provisioned"
            raise BusError(msg)
        return max(self.streams[stream].messages, default=0)

    async def stream_leader(self, stream: str) -> str:
        """Always "" (one in-process bus, no cluster: no other server can take a stream over)."""
        if stream not in self.streams:
            msg = f"stream {stream!r} is not provisioned"
            raise BusError(msg)
        return ""

    async def last_message(self, stream: str, subject: str, message_type: type[M]) -> M | None:
        """The newest message `stream` holds for `subject`, or None."""
        if stream not in self.streams:
            msg = f"stream {stream!r} is not provisioned"
            raise BusError(msg)
        for _, stored in sorted(self.streams[stream].messages.items(), reverse=True):
            if stored.subject == subject:
                return decode(stored.data, stored.headers, message_type)
        return None

    async def replay_sequenced(
        self, stream: str, subject: str, message_type: type[M]
    ) -> AsyncGenerator[tuple[int, M], None]:
        """Every message `stream` holds now for `subject`, oldest first, with its sequence."""
        if stream not in self.streams:
            msg = f"stream {stream!r} is not provisioned"
            raise BusError(msg)
        snapshot = sorted(self.streams[stream].messages.items())
        for _, stored in snapshot:
            if stored.subject == subject:
                try:
                    message = decode(stored.data, stored.headers, message_type)
                except DecodeError as exc:
                    log.warning("skipping an undecodable message of %s: %s", subject, exc)
                    continue
                yield stored.seq, message
                await asyncio.sleep(0)  # other tasks run between messages, as with `NatsBus`

    async def read_stream(
        self, stream: str, subject: str, message_type: type[M], *, after: int, through: int
    ) -> AsyncGenerator[tuple[int, Envelope[M] | None], None]:
        """The messages of `subject` (wildcards allowed) stored after `after`, up to `through`."""
        if stream not in self.streams:
            msg = f"stream {stream!r} is not provisioned"
            raise BusError(msg)
        snapshot = sorted(self.streams[stream].messages.items())
        for seq, stored in snapshot:
            if not after < seq <= through or not matches(subject, stored.subject):
                continue
            try:
                message = decode(stored.data, stored.headers, message_type)
            except DecodeError as exc:
                log.warning("skipping an undecodable message %d of %s: %s", seq, stream, exc)
                yield seq, None
                continue
            yield seq, Envelope(stored.subject, message, Headers.from_wire(stored.headers))

    async def purge(self, stream: str, subject: str) -> None:
        """Remove every message of `subject` from `stream`."""
        if stream not in self.streams:
            msg = f"stream {stream!r} is not provisioned"
            raise BusError(msg)
        messages = self.streams[stream].messages
        for seq in [seq for seq, stored in messages.items() if stored.subject == subject]:
            del messages[seq]

    def stream_messages(self, stream: str) -> list[tuple[str, bytes]]:
        """The subjects and payloads a stream holds now, in order (for assertions)."""
        return [(m.subject, m.data) for _, m in sorted(self.streams[stream].messages.items())]

    def durable(self, consumer: ConsumerSpec) -> tuple[Stream, Durable]:
        """The stream of `consumer` and its durable state, created or updated as a server would."""
        stream = self.streams.get(consumer.stream)
        if stream is None:
            msg = f"stream {consumer.stream!r} is not provisioned"
            raise BusError(msg)
        if stream.spec.retention is Retention.WORK_QUEUE:
            for (name, other), existing in self.durables.items():
                sibling = name == consumer.stream and other != consumer.durable
                if sibling and overlaps(existing.spec.filter_subject, consumer.filter_subject):
                    msg = f"consumer {consumer.durable!r}: filtered consumer not unique on workqueue stream"
                    raise BusError(msg)
        if consumer.provisioned and (consumer.stream, consumer.durable) not in self.durables:
            # As on NATS: a provisioned consumer is bound to, never made, by whoever pulls from it.
            msg = f"consumer {consumer.durable} of {consumer.stream} does not exist: run the provisioner"
            raise LayoutNotProvisionedError(msg)
        durable = self.durables.setdefault((consumer.stream, consumer.durable), Durable(consumer))
        durable.spec = consumer  # create or update, as on a real server
        return stream, durable
