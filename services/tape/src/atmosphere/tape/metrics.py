"""The tape's Prometheus series: events recorded from `ATMO_EVENTS`, in what batches, and the sweep's work.

Every tape replica records the whole stream, so each counts what it recorded itself (a sum over
replicas counts an event once per replica). How far a replica is behind the stream is
`atmosphere_replica_lag{store="ATMO_EVENTS"}` (`atmosphere.service.replica_metrics`).
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from atmosphere.service.telemetry import LATENCY_BUCKETS

EVENTS_RECORDED = Counter(
    "atmosphere_tape_events_recorded",
    "Run events read from ATMO_EVENTS whose batch was committed to the tape's store (those skipped included)",
)
EVENTS_SKIPPED = Counter(
    "atmosphere_tape_events_skipped",
    "Run events left out of the tape, by reason (unrecordable: no run id or a seq out of range; failed: could "
    "not become a step)",
    ("reason",),
)
BATCH_SIZE = Histogram(
    "atmosphere_tape_batch_size",
    "Events per recorded batch (one transaction)",
    buckets=(1, 2, 5, 10, 25, 50, 100, 250, 500, 1000),
)
RECORD_DURATION = Histogram(
    "atmosphere_tape_record_duration_seconds", "Time to record one batch", buckets=LATENCY_BUCKETS
)
RUNS_SWEPT = Counter(
    "atmosphere_tape_runs_swept",
    "Runs the periodic sweep changed, by what it did (abandoned: open and idle; expired: past max age)",
    ("action",),
)
