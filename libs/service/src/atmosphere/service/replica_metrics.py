"""The replicated stores' Prometheus series: how far each replica is behind its stream, what it applied.

Labelled by the stream a replica applies (`store`: `ATMO_GOVERNANCE`, `ATMO_MEMORY`,
`ATMO_EVENTS`, ...), one replica per stream in a process. The lag costs nothing extra: a replica
already asks the stream for its last sequence at every look (each poll, each doorbell, each
read barrier), and the gauge is set from that answer and from each applied batch.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

LAG = Gauge(
    "atmosphere_replica_lag",
    "Stream sequences the stream holds past what this replica applied, as of its last look at the stream",
    ("store",),
)
APPLIED = Counter("atmosphere_replica_applied", "Messages this replica applied to its store", ("store",))
READ_FAILURES = Counter(
    "atmosphere_replica_read_failures",
    "Reads of the stream that failed and are retried, by cause (unreachable: the broker; apply: this store)",
    ("store", "cause"),
)
