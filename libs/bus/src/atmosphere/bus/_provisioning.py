"""Making the JetStream layout exist (the provisioner), and checking that it does (a service with a login).

Streams, key-value buckets, object buckets and the provisioned durable consumers are made by
one login, the provisioner's (`atmosphere.bus.permissions.Role.PROVISIONER`): no service's own
login may create or change any of them, because whoever may create a consumer chooses where
it delivers and whoever may update a stream may shrink it to nothing. Each stream and bucket is
stamped with who provisioned it (`PROVISIONED_BY` in its metadata), which every service reports
in its info. A service with a login only checks that what it uses exists (`verify`), waiting
for a provisioner that runs beside it (a Kubernetes Job), and names what is missing.

Everything here is idempotent and tried again while a cluster elects its leaders (`patiently`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import nats.errors
import nats.js.errors
from nats.js import api as js_api
from nats.js.client import JetStreamContext

from atmosphere.bus._jetstream import (
    BucketSpec,
    ConsumerSpec,
    JetStreamLayout,
    ObjectBucketSpec,
    RequiredLayout,
    Retention,
    StreamSpec,
)
from atmosphere.bus._replication import placement, replicated, storage_type, update_in_place
from atmosphere.bus.errors import BusError

T = TypeVar("T")

log = logging.getLogger("atmosphere.bus")

PROVISIONED_BY = "atmosphere.provisioned_by"
"""The metadata key of a stream or bucket that names who provisioned it."""
JETSTREAM_PATIENCE = 60.0
"""Seconds an idempotent JetStream operation (provisioning, creating a consumer) is tried again
while a cluster elects its leaders; a cluster still electing after this long is broken."""
VERIFY_POLL = 0.5
"""Seconds between two looks at a layout not (yet) provisioned."""
DEFAULT_MAX_ACK_PENDING = 1000
"""JetStream's own default, for a provisioned consumer that states none."""

# JetStream's error code for "stream name already in use with a different configuration".
_STREAM_EXISTS_DIFFERENT = 10058
# nats-py's de-duplication window of a key-value bucket (shortened to a shorter max age).
_KV_DUPLICATE_WINDOW = 120.0
# Seconds within which two durations count as the same (the server keeps nanoseconds).
_TOLERANCE = 0.001
# What the JetStream API answers while a cluster elects a leader: nothing, or 503.
_ELECTING = (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError)
# 503s that no waiting cures: JetStream is off on the server, or for the account.
_JETSTREAM_OFF = frozenset({10076, 10039})
# "No suitable peers for placement": fewer servers are up than a stream's replicas need, as while
# a node restarts (a rolling update of the cluster). Waited out like an election.
_TOO_FEW_PEERS = 10005


class LayoutNotProvisionedError(BusError):
    """What a service needs is not (all) there, or not as it needs it: run the provisioner."""


@dataclass(frozen=True, slots=True)
class WireNames:
    """How logical names become wire names on one connection (its namespace)."""

    stream: Callable[[str], str]
    subject: Callable[[str], str]


def consumer_config(
    spec: ConsumerSpec, names: WireNames, *, max_ack_pending: int, replicas: int | None
) -> js_api.ConsumerConfig:
    """The JetStream configuration of the durable pull consumer `spec`."""
    return js_api.ConsumerConfig(
        # Named as well as durable: nats-py then creates it by
        # `$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>`, which the server checks against the
        # body, so a permission can name exactly the consumer and filter a login may create.
        name=spec.durable,
        durable_name=spec.durable,
        ack_policy=js_api.AckPolicy.EXPLICIT,
        ack_wait=spec.ack_wait_seconds,
        max_deliver=spec.max_deliver,
        filter_subject=names.subject(spec.filter_subject),
        max_ack_pending=max_ack_pending,
        inactive_threshold=spec.inactive_threshold_seconds or None,
        # As many replicas as the streams: a consumer on one server stops its work when that
        # server dies, however many copies the stream itself has.
        num_replicas=replicas,
    )


def consumer_mismatches(spec: ConsumerSpec, names: WireNames, found: js_api.ConsumerConfig) -> list[str]:
    """How the consumer `found` differs from the provisioned consumer `spec` (empty: as it must be)."""
    differences: list[str] = []
    wanted_filter = names.subject(spec.filter_subject)
    if (found.filter_subject or "") != wanted_filter:
        differences.append(f"filter {found.filter_subject!r}, not {wanted_filter!r}")
    if found.deliver_subject:
        differences.append(f"a push consumer delivering to {found.deliver_subject!r}, not a pull consumer")
    if abs((found.ack_wait or 0) - spec.ack_wait_seconds) >= _TOLERANCE:
        differences.append(f"ack wait {found.ack_wait:g} s, not {spec.ack_wait_seconds:g} s")
    if (found.max_deliver or -1) != spec.max_deliver:
        differences.append(f"max deliver {found.max_deliver}, not {spec.max_deliver}")
    if spec.max_ack_pending and (found.max_ack_pending or 0) != spec.max_ack_pending:
        differences.append(f"max ack pending {found.max_ack_pending}, not {spec.max_ack_pending}")
    return differences


@contextlib.contextmanager
def _made_meanwhile() -> Iterator[None]:
    """Let a bucket's creation find it made meanwhile by another provisioner (then updated as below).

    Two replicas of a service starting at once both find no bucket and create it; the one that
    comes second meets the first's bucket already stamped and updated, so JetStream refuses the
    bare creation as a different configuration. The update that follows makes it as wanted.
    """
    try:
        yield
    except nats.js.errors.BadRequestError as exc:
        if exc.err_code != _STREAM_EXISTS_DIFFERENT:
            raise


class LayoutProvisioner:
    """Provision a layout, or check one is provisioned, over one JetStream context."""

    def __init__(self, js: JetStreamContext, names: WireNames) -> None:
        """Work through `js`, naming streams and subjects by `names`."""
        self._js = js
        self._names = names

    async def provision(self, layout: JetStreamLayout, *, by: str) -> None:
        """Create or update every stream, bucket and consumer of `layout`, stamped as provisioned `by`.

        Raises:
            BusError: JetStream refused it, or gave no answer for `JETSTREAM_PATIENCE` seconds.
        """
        try:
            await patiently(lambda: self._provision_once(layout, by), "provisioning jetstream")
        except nats.js.errors.APIError as exc:
            msg = f"provisioning jetstream failed: {exc.description}"
            raise BusError(msg) from exc

    async def _provision_once(self, layout: JetStreamLayout, by: str) -> None:
        stamp = {PROVISIONED_BY: by}
        for stream in layout.streams():
            await self._ensure_stream(stream, stamp)
        for bucket in layout.buckets():
            await self._ensure_bucket(bucket, stamp)
        for objects in layout.object_buckets():
            await self._ensure_object_bucket(objects, stamp)
        for consumer in layout.consumers:
            await self._ensure_consumer(consumer, layout.replication.replicas)

    async def _ensure_stream(self, spec: StreamSpec, stamp: dict[str, str]) -> None:
        # JetStream refuses a de-duplication window longer than the stream's max age.
        window = spec.duplicate_window_seconds
        if spec.max_age_seconds:
            window = min(window, spec.max_age_seconds)
        config = js_api.StreamConfig(
            name=self._names.stream(spec.name),
            subjects=[self._names.subject(s) for s in spec.subjects],
            retention=(
                js_api.RetentionPolicy.WORK_QUEUE
                if spec.retention is Retention.WORK_QUEUE
                else js_api.RetentionPolicy.LIMITS
            ),
            max_age=spec.max_age_seconds,
            max_bytes=spec.max_bytes,
            duplicate_window=window,
            storage=storage_type(spec.replication),
            num_replicas=spec.replication.replicas,
            placement=placement(spec.replication),
            discard=js_api.DiscardPolicy.OLD,
            allow_direct=spec.allow_direct,
            metadata=dict(stamp),
        )
        try:
            await self._js.add_stream(config)
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code != _STREAM_EXISTS_DIFFERENT:
                raise
            assert config.name is not None
            current = (await self._js.stream_info(config.name)).config
            await update_in_place(self._js, current, config.evolve(metadata={**(current.metadata or {}), **stamp}))

    async def _ensure_bucket(self, spec: BucketSpec, stamp: dict[str, str]) -> None:
        name = self._names.stream(spec.name)
        try:
            await self._js.key_value(name)
        except nats.js.errors.BucketNotFoundError:
            with _made_meanwhile():
                await self._js.create_key_value(
                    js_api.KeyValueConfig(
                        bucket=name,
                        history=spec.history,
                        ttl=spec.max_age_seconds or None,
                        replicas=spec.replication.replicas,
                        storage=storage_type(spec.replication),
                    )
                )
        # Then the rest, which nats-py does not pass on when it creates a bucket: placement,
        # the stamp, no roll-ups; and an existing bucket's entry age and replication.
        current = (await self._js.stream_info(f"KV_{name}")).config
        wanted = replicated(current, spec.replication)
        max_age = spec.max_age_seconds
        if abs((current.max_age or 0) - max_age) >= _TOLERANCE:
            # JetStream refuses a de-duplication window longer than the max age.
            window = min(current.duplicate_window or _KV_DUPLICATE_WINDOW, max_age or _KV_DUPLICATE_WINDOW)
            wanted = wanted.evolve(max_age=max_age, duplicate_window=window)
        # A roll-up header empties a bucket in one publish: its writers put and delete keys
        # (neither needs one), and none of them may empty it (nats-py's `purge` of a key would).
        wanted = wanted.evolve(allow_rollup_hdrs=False, metadata={**(current.metadata or {}), **stamp})
        await update_in_place(self._js, current, wanted)

    async def _ensure_object_bucket(self, spec: ObjectBucketSpec, stamp: dict[str, str]) -> None:
        name = self._names.stream(spec.name)
        try:
            await self._js.object_store(name)
        except nats.js.errors.BucketNotFoundError:
            config = js_api.ObjectStoreConfig(
                ttl=spec.max_age_seconds or None,
                max_bytes=spec.max_bytes,
                storage=storage_type(spec.replication),
                replicas=spec.replication.replicas,
                placement=placement(spec.replication),
            )
            with _made_meanwhile():
                await self._js.create_object_store(name, config)
        current = (await self._js.stream_info(f"OBJ_{name}")).config
        # An object's metadata is written with a roll-up: an object bucket keeps them.
        wanted = replicated(current, spec.replication).evolve(metadata={**(current.metadata or {}), **stamp})
        await update_in_place(self._js, current, wanted)

    async def _ensure_consumer(self, spec: ConsumerSpec, replicas: int) -> None:
        pending = spec.max_ack_pending or DEFAULT_MAX_ACK_PENDING
        config = consumer_config(spec, self._names, max_ack_pending=pending, replicas=replicas)
        # Create or update: a consumer left by an earlier version takes the current settings.
        await self._js.add_consumer(self._names.stream(spec.stream), config)

    async def verify(self, required: RequiredLayout, *, timeout: float) -> str:
        """Wait until everything `required` names exists (consumers as configured); who provisioned it.

        Asks only what a role with `required`'s permissions may ask (stream and consumer info).
        Returns the provisioner's name stamped on the streams and buckets ("" when none is: made
        by an older version).

        Raises:
            LayoutNotProvisionedError: still missing after `timeout` seconds, naming what and why.
        """
        deadline = time.monotonic() + timeout
        reported = False
        while True:
            problems, by = await self._look(required)
            if not problems:
                return by
            if time.monotonic() >= deadline:
                msg = (
                    f"the JetStream layout is not provisioned: {'; '.join(problems)}. Run the provisioner "
                    "(`atmosphere provision`, or the provision Job) with the provisioner's login"
                )
                raise LayoutNotProvisionedError(msg)
            if not reported:
                log.info("waiting for the JetStream layout to be provisioned: %s", "; ".join(problems))
                reported = True
            await asyncio.sleep(VERIFY_POLL)

    async def _look(self, required: RequiredLayout) -> tuple[list[str], str]:
        problems: list[str] = []
        stamps: list[str] = []
        wire_names = [
            *((s, self._names.stream(s)) for s in required.streams),
            *((f"bucket {b}", f"KV_{self._names.stream(b)}") for b in required.buckets),
            *((f"object bucket {b}", f"OBJ_{self._names.stream(b)}") for b in required.object_buckets),
        ]
        for what, wire in wire_names:
            try:
                info = await self._js.stream_info(wire)
            except nats.js.errors.NotFoundError:
                problems.append(f"{what} does not exist")
                continue
            except (*_ELECTING, nats.js.errors.APIError) as exc:
                problems.append(f"{what} cannot be read ({exc})")
                continue
            stamps.append((info.config.metadata or {}).get(PROVISIONED_BY, ""))
        for consumer in required.consumers:
            problems += await self.consumer_problems(consumer)
        return problems, next((s for s in stamps if s), "")

    async def consumer_problems(self, spec: ConsumerSpec) -> list[str]:
        """Why the provisioned consumer `spec` cannot be bound to as it is (empty: it can)."""
        what = f"consumer {spec.durable} of {spec.stream}"
        try:
            info = await self._js.consumer_info(self._names.stream(spec.stream), spec.durable)
        except nats.js.errors.NotFoundError:
            return [f"{what} does not exist"]
        except (*_ELECTING, nats.js.errors.APIError) as exc:
            return [f"{what} cannot be read ({exc})"]
        return [f"{what} has {d}" for d in consumer_mismatches(spec, self._names, info.config)]


async def patiently(operation: Callable[[], Awaitable[T]], what: str) -> T:
    """`operation()`, tried again for up to `JETSTREAM_PATIENCE` s while JetStream is not ready.

    Not ready: electing its leaders, or short of servers for a stream's replicas (a node
    restarting). Only for idempotent operations: doing again what is already done changes nothing.
    """
    deadline = time.monotonic() + JETSTREAM_PATIENCE
    attempt = 0
    while True:
        try:
            return await operation()
        except (*_ELECTING, nats.js.errors.BadRequestError) as exc:
            if isinstance(exc, nats.js.errors.BadRequestError) and exc.err_code != _TOO_FEW_PEERS:
                raise
            if isinstance(exc, nats.js.errors.APIError) and exc.err_code in _JETSTREAM_OFF:
                raise
            if time.monotonic() >= deadline:
                msg = f"{what} failed: jetstream gave no answer within {JETSTREAM_PATIENCE:g}s ({exc})"
                raise BusError(msg) from exc
            attempt += 1
            log.info("%s: jetstream not ready (%s); trying again", what, exc)
            await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
