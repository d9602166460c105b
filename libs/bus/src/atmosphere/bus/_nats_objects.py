"""Object buckets for `NatsBus`: data too large for one message, stored in chunks that each fit in one."""

from __future__ import annotations

import base64
import contextlib
import hashlib

import nats.errors
import nats.js.errors
from nats.js import api as js_api
from nats.js.client import JetStreamContext
from nats.js.object_store import OBJ_CHUNKS_PRE_TEMPLATE, OBJ_DIGEST_TYPE, OBJ_STREAM_TEMPLATE, ObjectStore

from atmosphere.bus._direct import DirectReader
from atmosphere.bus._nats_core import NatsCore
from atmosphere.bus.errors import BusError, PayloadTooLargeError
from atmosphere.bus.sizes import MAX_OBJECT_BYTES, data_budget

# Chunks of an object are at most this large (nats-py's default), and never over the data budget.
_OBJECT_CHUNK_BYTES = 128 * 1024


class ObjectBuckets:
    """`NatsBus`'s object-store operations, by logical bucket names."""

    def __init__(self, bus: NatsCore, js: JetStreamContext, direct: DirectReader) -> None:
        """Open buckets through `js` and read chunks through `direct`, naming them as `bus` does."""
        self._bus = bus
        self._js = js
        self._direct = direct
        self._objects: dict[str, ObjectStore] = {}

    async def _object_bucket(self, bucket: str) -> ObjectStore:
        store = self._objects.get(bucket)
        if store is None:
            try:
                store = await self._js.object_store(self._bus.stream_name(bucket))
            except nats.js.errors.BucketNotFoundError as exc:
                msg = f"object bucket {bucket!r} is not provisioned"
                raise BusError(msg) from exc
            self._objects[bucket] = store
        return store

    async def put(self, bucket: str, name: str, data: bytes) -> None:
        """Store `data` under `name`, in chunks that each fit in one message."""
        self._bus._ensure_open(f"store {name!r} in {bucket!r}")
        if len(data) > MAX_OBJECT_BYTES:
            raise PayloadTooLargeError(f"object {bucket}/{name}", len(data), MAX_OBJECT_BYTES)
        store = await self._object_bucket(bucket)
        # Each chunk is one message: nats-py's default size may exceed a lowered `max_payload`.
        chunk = min(_OBJECT_CHUNK_BYTES, data_budget(self._bus.max_payload))
        meta = js_api.ObjectMeta(name=name, options=js_api.ObjectMetaOptions(max_chunk_size=chunk))
        try:
            await store.put(name, data, meta=meta)
        except nats.errors.Error as exc:
            msg = f"storing object {name!r} in {bucket!r} failed: {exc}"
            raise BusError(msg) from exc

    async def get(self, bucket: str, name: str) -> bytes | None:
        """The whole object under `name`, or None when there is none."""
        store = await self._object_bucket(bucket)
        try:
            info = await store.get_info(name)
        except nats.js.errors.NotFoundError:
            return None
        except nats.errors.Error as exc:
            msg = f"reading object {name!r} of {bucket!r} failed: {exc}"
            raise BusError(msg) from exc
        size = info.size or 0
        if size > MAX_OBJECT_BYTES:
            msg = f"object {name!r} of {bucket!r} is {size} bytes, over the {MAX_OBJECT_BYTES} the bus reads"
            raise BusError(msg)
        if size == 0:
            return b""
        return await self._object_chunks(self._bus.stream_name(bucket), info, size)

    async def _object_chunks(self, bucket_name: str, info: js_api.ObjectInfo, size: int) -> bytes:
        """An object's chunks joined, checked against its size and digest.

        Read by batched direct gets, as replays are: no consumer, so a login that may not create
        one (`atmosphere.bus.permissions`) reads objects all the same. Not with nats-py's
        `ObjectStore.get`, which makes an ordered consumer, waits forever for a chunk that never
        comes and copies everything received so far on every chunk.
        """
        stream = OBJ_STREAM_TEMPLATE.format(bucket=bucket_name)
        chunks = OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=bucket_name, obj=info.nuid)
        data = bytearray()
        digest = hashlib.sha256()

        async def more_to_read(_next_seq: int) -> bool:
            return len(data) < size  # chunks are stored before their object's info: a lagging replica

        # Every chunk is stored before the info that names them, so all of them are at most the
        # stream's newest sequence now.
        through = await self._stream_last_seq_of(stream)
        try:
            read = self._direct.read(stream, chunks, through=through, more_to_read=more_to_read)
            async with contextlib.aclosing(read) as stored:
                async for chunk in stored:
                    data += chunk.data
                    digest.update(chunk.data)
                    if len(data) >= size:
                        break
        except BusError as exc:
            msg = f"reading object {info.name!r} stalled after {len(data)} of {size} bytes ({exc})"
            raise BusError(msg) from exc
        if len(data) != size or not _digest_matches(info.digest or "", digest.digest()):
            msg = f"object {info.name!r} did not arrive whole ({len(data)} of {size} bytes, or a wrong digest)"
            raise BusError(msg)
        return bytes(data)

    async def _stream_last_seq_of(self, stream_name: str) -> int:
        try:
            info = await self._js.stream_info(stream_name)
        except nats.errors.Error as exc:
            msg = f"reading stream {stream_name!r} failed: {exc}"
            raise BusError(msg) from exc
        return info.state.last_seq or 0

    async def delete(self, bucket: str, name: str) -> None:
        """Delete the object under `name`; nothing happens when there is none."""
        store = await self._object_bucket(bucket)
        try:
            await store.delete(name)
        except nats.js.errors.NotFoundError:
            return
        except nats.errors.Error as exc:
            msg = f"deleting object {name!r} of {bucket!r} failed: {exc}"
            raise BusError(msg) from exc


def _digest_matches(recorded: str, sha256: bytes) -> bool:
    """Whether an object's recorded digest (`SHA-256=<url-safe base64>`) is `sha256`."""
    if not recorded.upper().startswith(OBJ_DIGEST_TYPE):
        return False
    try:
        return base64.urlsafe_b64decode(recorded[len(OBJ_DIGEST_TYPE) :]) == sha256
    except ValueError:
        return False
