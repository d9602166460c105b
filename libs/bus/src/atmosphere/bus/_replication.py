"""A stream's replication on the wire, and bringing an existing stream to it in place.

Streams, key-value buckets and object buckets are all JetStream streams underneath, so one
reconciliation serves the three: a system that ran on one replica is raised to three by
starting it with the new setting, without losing a message.
"""

from __future__ import annotations

import logging

import nats.js.errors
from nats.js import api as js_api
from nats.js.client import JetStreamContext

from atmosphere.bus._jetstream import Replication, Storage

log = logging.getLogger("atmosphere.bus")


def storage_type(replication: Replication) -> js_api.StorageType:
    """The storage type JetStream is asked for."""
    return js_api.StorageType.MEMORY if replication.storage is Storage.MEMORY else js_api.StorageType.FILE


def placement(replication: Replication) -> js_api.Placement | None:
    """The placement JetStream is asked for; None lets the server choose (and keeps an existing one)."""
    if not replication.placed:
        return None
    return js_api.Placement(
        cluster=replication.placement_cluster or None, tags=list(replication.placement_tags) or None
    )


def replicated(config: js_api.StreamConfig, replication: Replication) -> js_api.StreamConfig:
    """`config` with the replica count, storage and placement of `replication`."""
    return config.evolve(
        num_replicas=replication.replicas,
        storage=storage_type(replication),
        placement=placement(replication) or config.placement,
    )


def _same_placement(a: js_api.Placement | None, b: js_api.Placement | None) -> bool:
    def key(p: js_api.Placement | None) -> tuple[str, tuple[str, ...]]:
        return (p.cluster or "", tuple(p.tags or ())) if p else ("", ())

    return key(a) == key(b)


async def update_in_place(js: JetStreamContext, current: js_api.StreamConfig, wanted: js_api.StreamConfig) -> None:
    """Update the stream configured as `current` to `wanted`, when they differ.

    The storage type stays as it is: JetStream cannot change it on an existing stream, and
    recreating the stream would drop its messages, so a warning says how to change it. A
    replica change and a move (a new placement) go in separate updates, because JetStream
    refuses the two in one; the move comes last, and one JetStream cannot start now (another
    reconfiguration in flight) is logged and left to the next start, not a failed provisioning.
    """
    name = current.name or wanted.name or "?"
    if (wanted.storage or js_api.StorageType.FILE) != (current.storage or js_api.StorageType.FILE):
        log.warning(
            "stream %s keeps its %s storage: JetStream cannot change the storage of an existing stream "
            "(to use %s, delete the stream and start again; its messages are then lost)",
            name,
            js_api.StorageType(current.storage or "file").value,
            js_api.StorageType(wanted.storage or "file").value,
        )
        wanted = wanted.evolve(storage=current.storage)
    moving = wanted.placement is not None and not _same_placement(current.placement, wanted.placement)
    staying = wanted.evolve(placement=current.placement)
    if staying != current:
        if (staying.num_replicas or 1) != (current.num_replicas or 1):
            log.info("stream %s: %d replicas -> %d", name, current.num_replicas or 1, staying.num_replicas or 1)
        await js.update_stream(staying)
    if moving:
        try:
            await js.update_stream(wanted)
        except nats.js.errors.APIError as exc:
            log.warning("stream %s not moved to its placement now (%s); the next start tries again", name, exc)
        else:
            log.info("stream %s: moving to placement %s", name, wanted.placement)
