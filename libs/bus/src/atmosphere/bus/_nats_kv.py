"""Key-value buckets for `NatsBus`: provisioned JetStream buckets, each opened once per connection."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import nats.errors
import nats.js.errors
from google.protobuf.message import Message
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from atmosphere.bus._codec import decode
from atmosphere.bus._nats_core import WRONG_LAST_SEQUENCE, NatsCore
from atmosphere.bus.errors import BusError

M = TypeVar("M", bound=Message)

# How many times `kv_update` reads and writes again after another writer changed the key first.
_KV_UPDATE_ATTEMPTS = 32


class KeyValueBuckets:
    """`NatsBus`'s key-value operations, by logical bucket names."""

    def __init__(self, bus: NatsCore, js: JetStreamContext) -> None:
        """Open buckets through `js`, naming them and checking sizes as `bus` does."""
        self._bus = bus
        self._js = js
        self._kv: dict[str, KeyValue] = {}

    async def _bucket(self, bucket: str) -> KeyValue:
        kv = self._kv.get(bucket)
        if kv is None:
            try:
                kv = await self._js.key_value(self._bus.stream_name(bucket))
            except nats.js.errors.BucketNotFoundError as exc:
                msg = f"bucket {bucket!r} is not provisioned"
                raise BusError(msg) from exc
            self._kv[bucket] = kv
        return kv

    async def put(self, bucket: str, key: str, message: Message) -> None:
        """Store `message` under `key`."""
        kv = await self._bucket(bucket)
        data = message.SerializeToString()
        self._bus._checked(f"$KV.{bucket}.{key}", data, None)
        try:
            await kv.put(key, data)
        except nats.errors.Error as exc:  # a broker away or not answering: the caller's BusError
            msg = f"storing {key!r} in bucket {bucket!r} failed: {exc}"
            raise BusError(msg) from exc

    async def get(self, bucket: str, key: str, message_type: type[M]) -> M | None:
        """The value under `key`, or None."""
        kv = await self._bucket(bucket)
        try:
            entry = await kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):  # never written, or deleted
            return None
        return decode(entry.value or b"", None, message_type)

    async def items(self, bucket: str, message_type: type[M]) -> dict[str, M]:
        """Every key and value of a bucket."""
        await self._bucket(bucket)
        # The keys come from the bucket stream's per-subject counts, answered by the server in
        # one reply. nats-py's `keys()` walks a watcher that can report "no more keys" before
        # the first one arrived on a busy machine, which reads as an empty bucket.
        name = self._bus.stream_name(bucket)
        prefix = f"$KV.{name}."
        try:
            info = await self._js.stream_info(f"KV_{name}", subjects_filter=f"{prefix}>")
        except nats.errors.Error as exc:
            msg = f"listing bucket {bucket!r} failed: {exc}"
            raise BusError(msg) from exc
        keys = sorted(subject.removeprefix(prefix) for subject in (info.state.subjects or {}))
        items: dict[str, M] = {}
        for key in keys:
            value = await self.get(bucket, key, message_type)
            if value is not None:
                items[key] = value
        return items

    async def delete(self, bucket: str, key: str) -> None:
        """Remove `key` (a delete marker: readers see no value; nothing happens when it is not there)."""
        kv = await self._bucket(bucket)
        try:
            await kv.delete(key)
        except nats.errors.Error as exc:
            msg = f"deleting {key!r} from bucket {bucket!r} failed: {exc}"
            raise BusError(msg) from exc

    async def update(
        self, bucket: str, key: str, message_type: type[M], change: Callable[[M | None], M | None]
    ) -> M | None:
        """Read the key and its revision, change it, write it only if that revision is still the newest."""
        kv = await self._bucket(bucket)
        for _ in range(_KV_UPDATE_ATTEMPTS):
            try:
                current, revision = await _kv_entry(kv, key, message_type)
                new = change(current)
                if new is current:
                    return current
                if new is None:
                    await kv.delete(key, last=revision)
                    return None
                data = new.SerializeToString()
                self._bus._checked(f"$KV.{bucket}.{key}", data, None)
                await kv.update(key, data, last=revision)
            except nats.js.errors.KeyWrongLastSequenceError:
                continue  # another writer came first: change its value instead
            except nats.js.errors.APIError as exc:
                if exc.err_code in (WRONG_LAST_SEQUENCE, 10164):  # 10164: the same, without the sequence
                    continue  # a delete that lost the race (nats-py reports only updates as such)
                msg = f"updating {key!r} in bucket {bucket!r} failed: {exc}"
                raise BusError(msg) from exc
            except nats.errors.Error as exc:
                msg = f"updating {key!r} in bucket {bucket!r} failed: {exc}"
                raise BusError(msg) from exc
            return new
        msg = f"updating {key!r} in bucket {bucket!r} failed: other writers changed it {_KV_UPDATE_ATTEMPTS} times over"
        raise BusError(msg)


async def _kv_entry(kv: KeyValue, key: str, message_type: type[M]) -> tuple[M | None, int]:
    """The value under `key` (None: none) and the revision a write after it must name."""
    try:
        entry = await kv.get(key)
    except nats.js.errors.KeyNotFoundError as exc:
        # A deleted key's marker is its newest revision (what the next write follows); a key
        # never written (or expired) has none, and a write naming revision 0 creates it.
        marker = exc.entry
        return None, (marker.revision or 0) if marker is not None else 0
    return decode(entry.value or b"", None, message_type), entry.revision or 0
