"""What JetStream must hold: stream, consumer and bucket specifications (plain data)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum

from atmosphere.bus import subjects


class Retention(Enum):
    """How long a stream keeps a message."""

    LIMITS = "limits"
    """Until an age or size limit evicts it."""
    WORK_QUEUE = "workqueue"
    """Until a consumer acknowledges it."""


class Storage(Enum):
    """Where the servers keep a stream's messages."""

    FILE = "file"
    """On disk: survives a server restart."""
    MEMORY = "memory"
    """In memory: faster, lost when every replica restarts at once."""


MAX_REPLICAS = 5
"""JetStream's limit on the replicas of one stream."""


@dataclass(frozen=True, slots=True)
class Replication:
    """How many servers keep a stream or bucket, on what medium, and on which servers.

    One R1 stream is enough to stop the system when its server dies (a run needs the run queue,
    the events, the journal and the descriptor buckets alike), so a layout gives all of them the
    same replication. More than one replica needs a JetStream cluster: a single server refuses it.
    """

    replicas: int = 1
    storage: Storage = Storage.FILE
    """Fixed at creation: JetStream cannot change it on an existing stream, which keeps its own."""
    placement_cluster: str = ""
    """Keep the replicas in this cluster (empty: the server chooses)."""
    placement_tags: tuple[str, ...] = ()
    """Keep the replicas on servers carrying every one of these tags (empty: any server)."""

    def __post_init__(self) -> None:
        if not 1 <= self.replicas <= MAX_REPLICAS:
            msg = f"replicas must be between 1 and {MAX_REPLICAS}, not {self.replicas}"
            raise ValueError(msg)

    @property
    def placed(self) -> bool:
        """Whether a placement was asked for (else the server places the replicas)."""
        return bool(self.placement_cluster or self.placement_tags)


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """A stream to provision."""

    name: str
    subjects: tuple[str, ...]
    retention: Retention = Retention.LIMITS
    max_age_seconds: float = 0
    """0 keeps messages forever (within the size limit)."""
    max_bytes: int = -1
    """-1 means no size limit."""
    duplicate_window_seconds: float = 120
    """How long a `Nats-Msg-Id` is remembered for de-duplication."""
    replication: Replication = Replication()
    allow_direct: bool = True
    """Every replica answers direct gets (JetStream's `allow_direct`): `Bus.replay` reads a
    stream by them, with no consumer per reader, so a stream without it cannot be replayed."""


@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    """A durable pull consumer."""

    stream: str
    durable: str
    filter_subject: str
    ack_wait_seconds: float = 30
    """Unacked (and not kept alive) messages are redelivered after this long."""
    heartbeat_seconds: float = 0
    """How often a message being handled is kept alive (in-progress acks); 0: a third of the ack wait."""
    max_deliver: int = -1
    """-1 redelivers forever."""
    confirm_ack: bool = False
    """Wait for the server to confirm each ack. Worth a round trip for expensive work (a run),
    not for cheap idempotent work (recording an event), where a lost ack only redelivers."""
    batch_fetch: bool = True
    """Fetch as many messages as there are free slots. Off, each fetch asks for one: an idle
    worker then gets a new message the moment it is published, where a batch pull (nats-py)
    holds its first message until the batch fills or the pull expires (up to a second). Worth
    a round trip per message for latency-sensitive work (a run); not for a stream of events."""
    inactive_threshold_seconds: float = 0
    """The server removes the consumer after this long with nobody pulling (0: never). For a
    consumer of one replica's own (one that applies the whole stream to that replica's store):
    a replica gone for good leaves nothing behind."""
    max_ack_pending: int = 0
    """Messages handed out and not yet acknowledged at most (0: `Bus.consume` derives it from its
    `max_inflight`). A provisioned consumer states it: the provisioner does not know the workers."""
    provisioned: bool = False
    """Made by the provisioner (it is among `JetStreamLayout.consumers`): `Bus.consume` only binds
    to it, and fails naming it when it is missing or configured otherwise, where a consumer not
    provisioned is created or updated by whoever consumes it. No service login may create one
    (`atmosphere.bus.permissions`): whoever may create a consumer chooses where it delivers."""


@dataclass(frozen=True, slots=True)
class BucketSpec:
    """A key-value bucket to provision."""

    name: str
    history: int = 1
    max_age_seconds: float = 0
    """An entry expires this long after its last write (0: never). Provisioning sets it on an
    existing bucket too, so a bucket made by an older version without one gets it."""
    replication: Replication = Replication()


@dataclass(frozen=True, slots=True)
class ObjectBucketSpec:
    """An object-store bucket to provision: named blobs of any size, stored in chunks."""

    name: str
    max_age_seconds: float = 0
    """Objects older than this are removed (0: kept until deleted)."""
    max_bytes: int = -1
    """-1 means no size limit; a full bucket refuses new objects."""
    replication: Replication = Replication()


@dataclass(frozen=True, slots=True)
class RequiredLayout:
    """What must exist for someone to work: streams and buckets by name, and provisioned consumers.

    A service with a login checks it at start (`Bus.verify`) instead of making it: only the
    provisioner may (`atmosphere.bus.permissions`).
    """

    streams: tuple[str, ...] = ()
    buckets: tuple[str, ...] = ()
    object_buckets: tuple[str, ...] = ()
    consumers: tuple[ConsumerSpec, ...] = ()
    """With the configuration they must have (`ConsumerSpec.provisioned`)."""


@dataclass(frozen=True, slots=True)
class JetStreamLayout:
    """The system's JetStream layout: its streams, key-value buckets and object buckets.

    `ATMO_RUNS`, `ATMO_EVENTS`, `ATMO_JOURNAL`, the descriptor buckets `ATMO_AGENTS` and `ATMO_TOOLS`, and the
    object bucket `ATMO_TOOL_RESULTS` (tool results too large for one message).

    `replication` applies to every one of them, `extra_streams` included; provisioning brings
    existing ones to it in place (the replica count and placement; storage stays as created).
    Durable consumers take its replica count too.
    """

    replication: Replication = Replication()

    events_max_age_seconds: float = 24 * 3600
    events_max_bytes: int = 1 << 30
    runs_max_age_seconds: float = 24 * 3600
    tool_results_max_age_seconds: float = 3600
    """A result is read (and deleted) right after its call; this only clears what a crash left."""
    tool_results_max_bytes: int = 256 << 20
    """JetStream reserves this much of the server's storage; a full bucket refuses new results
    (the sandbox then cuts a result to fit in one message, with a marker)."""
    agents_max_age_seconds: float = 30.0
    """An agent descriptor expires this long after dispatch last wrote it (0: never). Dispatch
    rewrites its descriptors every third of it, so only agents some dispatch serves are listed."""
    journal_max_age_seconds: float = 7 * 24 * 3600
    """How long the journal of a failed (or unfinished) run is kept as a resume anchor; a run that
    succeeds removes its journal at once."""
    journal_max_bytes: int = 1 << 30
    memory_log_max_bytes: int = -1
    """`ATMO_MEMORY` is memory's store of record: kept whole (no age limit) so that a new
    replica can apply it from the start; -1 means no size limit."""
    governance_log_max_age_seconds: float = 30 * 24 * 3600
    """`ATMO_GOVERNANCE` holds the decision log and what the counters are rebuilt from; a new
    governance replica has what it still holds (the decision log's own retention is shorter)."""
    governance_log_max_bytes: int = 1 << 30
    extra_streams: tuple[StreamSpec, ...] = field(default_factory=tuple)
    consumers: tuple[ConsumerSpec, ...] = field(default_factory=tuple)
    """Durable consumers the provisioner makes with the streams (`ConsumerSpec.provisioned`), with
    the layout's replica count; the run queue's workers (`atmosphere.bus.run_queue`)."""

    def streams(self) -> tuple[StreamSpec, ...]:
        """Every stream of the layout."""
        runs = StreamSpec(
            name=subjects.RUNS_STREAM,
            subjects=(subjects.run_submit_all(),),
            retention=Retention.WORK_QUEUE,
            max_age_seconds=self.runs_max_age_seconds,
        )
        events = StreamSpec(
            name=subjects.EVENTS_STREAM,
            subjects=(subjects.run_events_all(), subjects.run_probes_all()),
            max_age_seconds=self.events_max_age_seconds,
            max_bytes=self.events_max_bytes,
        )
        journal = StreamSpec(
            name=subjects.JOURNAL_STREAM,
            subjects=(subjects.run_journal_all(),),
            max_age_seconds=self.journal_max_age_seconds,
            max_bytes=self.journal_max_bytes,
        )
        memory_log = StreamSpec(
            name=subjects.MEMORY_LOG_STREAM,
            subjects=(subjects.memory_log(),),
            max_bytes=self.memory_log_max_bytes,
        )
        governance_log = StreamSpec(
            name=subjects.GOVERNANCE_LOG_STREAM,
            subjects=(subjects.governance_log_all(),),
            max_age_seconds=self.governance_log_max_age_seconds,
            max_bytes=self.governance_log_max_bytes,
        )
        # One replication for all, set here so that no stream of the layout can miss it.
        every = (runs, events, journal, memory_log, governance_log, *self.extra_streams)
        return tuple(dataclasses.replace(spec, replication=self.replication) for spec in every)

    def buckets(self) -> tuple[BucketSpec, ...]:
        """Every key-value bucket of the layout."""
        agents = BucketSpec(subjects.AGENTS_BUCKET, max_age_seconds=self.agents_max_age_seconds)
        # Ingress's shared record per conversation; a day is many idle timeouts (30 min by default).
        conversations = BucketSpec(subjects.CONVERSATIONS_BUCKET, max_age_seconds=24 * 3600)
        # A retried completion attaches to its run while the run's events are kept (a day by default).
        completions = BucketSpec(subjects.COMPLETIONS_BUCKET, max_age_seconds=24 * 3600)
        every = (agents, BucketSpec(subjects.TOOLS_BUCKET), conversations, completions)
        return tuple(dataclasses.replace(spec, replication=self.replication) for spec in every)

    def required(self) -> RequiredLayout:
        """Everything of the layout by name, and its consumers: what provisioning it makes exist."""
        return RequiredLayout(
            streams=tuple(s.name for s in self.streams()),
            buckets=tuple(b.name for b in self.buckets()),
            object_buckets=tuple(b.name for b in self.object_buckets()),
            consumers=self.consumers,
        )

    def object_buckets(self) -> tuple[ObjectBucketSpec, ...]:
        """Every object-store bucket of the layout."""
        results = ObjectBucketSpec(
            subjects.TOOL_RESULTS_BUCKET,
            max_age_seconds=self.tool_results_max_age_seconds,
            max_bytes=self.tool_results_max_bytes,
        )
        return tuple(dataclasses.replace(spec, replication=self.replication) for spec in (results,))
