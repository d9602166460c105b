"""Key-value and object buckets in memory, under `atmosphere.bus.testing.FakeBus`.

An object is kept whole (no chunks), its size limit enforced as `NatsBus` enforces it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from google.protobuf.message import Message

from atmosphere.bus._codec import decode
from atmosphere.bus._fake_core import FakeCore
from atmosphere.bus._jetstream import JetStreamLayout, RequiredLayout
from atmosphere.bus.errors import BusError, PayloadTooLargeError
from atmosphere.bus.sizes import MAX_OBJECT_BYTES

M = TypeVar("M", bound=Message)


class FakeBuckets:
    """The key-value and object buckets of one `FakeBus`."""

    def __init__(self, bus: FakeCore) -> None:
        """No buckets until a layout is provisioned; values are checked as `bus` checks a send."""
        self._bus = bus
        self._kv: dict[str, dict[str, bytes]] = {}
        self._objects: dict[str, dict[str, bytes]] = {}

    def provision(self, layout: JetStreamLayout) -> None:
        """Create the buckets of `layout` that do not exist yet."""
        for bucket in layout.buckets():
            self._kv.setdefault(bucket.name, {})
        for objects in layout.object_buckets():
            self._objects.setdefault(objects.name, {})

    def missing(self, required: RequiredLayout) -> list[str]:
        """What `required` names of buckets that does not exist."""
        return [
            *(f"bucket {b} does not exist" for b in required.buckets if b not in self._kv),
            *(f"object bucket {b} does not exist" for b in required.object_buckets if b not in self._objects),
        ]

    def _bucket(self, bucket: str) -> dict[str, bytes]:
        try:
            return self._kv[bucket]
        except KeyError:
            msg = f"bucket {bucket!r} is not provisioned"
            raise BusError(msg) from None

    async def kv_put(self, bucket: str, key: str, message: Message) -> None:
        """Store `message` under `key`."""
        data = message.SerializeToString()
        self._bus._check(f"$KV.{bucket}.{key}", data, None)
        self._bucket(bucket)[key] = data

    async def kv_get(self, bucket: str, key: str, message_type: type[M]) -> M | None:
        """The value under `key`, or None."""
        data = self._bucket(bucket).get(key)
        return None if data is None else decode(data, None, message_type)

    async def kv_items(self, bucket: str, message_type: type[M]) -> dict[str, M]:
        """Every key and value of a bucket."""
        return {k: decode(v, None, message_type) for k, v in self._bucket(bucket).items()}

    async def kv_delete(self, bucket: str, key: str) -> None:
        """Remove `key` (nothing happens when it is not there)."""
        self._bucket(bucket).pop(key, None)

    async def kv_update(
        self, bucket: str, key: str, message_type: type[M], change: Callable[[M | None], M | None]
    ) -> M | None:
        """Read, change and write `key` with no await in between: nobody can write meanwhile."""
        values = self._bucket(bucket)
        stored = values.get(key)
        current = None if stored is None else decode(stored, None, message_type)
        new = change(current)
        if new is current:
            return current
        if new is None:
            values.pop(key, None)
            return None
        data = new.SerializeToString()
        self._bus._check(f"$KV.{bucket}.{key}", data, None)
        values[key] = data
        return new

    def _object_bucket(self, bucket: str) -> dict[str, bytes]:
        try:
            return self._objects[bucket]
        except KeyError:
            msg = f"object bucket {bucket!r} is not provisioned"
            raise BusError(msg) from None

    async def object_put(self, bucket: str, name: str, data: bytes) -> None:
        """Store `data` under `name` (whole: chunking is the broker's business)."""
        self._bus._ensure_open(f"store {name!r} in {bucket!r}")
        if len(data) > MAX_OBJECT_BYTES:
            raise PayloadTooLargeError(f"object {bucket}/{name}", len(data), MAX_OBJECT_BYTES)
        self._object_bucket(bucket)[name] = bytes(data)
        await asyncio.sleep(0)

    async def object_get(self, bucket: str, name: str) -> bytes | None:
        """The object under `name`, or None."""
        return self._object_bucket(bucket).get(name)

    async def object_delete(self, bucket: str, name: str) -> None:
        """Delete the object under `name` if there is one."""
        self._object_bucket(bucket).pop(name, None)

    def object_names(self, bucket: str) -> list[str]:
        """The names a bucket holds now (for assertions)."""
        return sorted(self._object_bucket(bucket))
