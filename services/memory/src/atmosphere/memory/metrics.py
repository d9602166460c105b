"""Memory's Prometheus series: history read and written, facts screened into long-term memory and recalled.

Counted by the replica that took the request, once it answered (the other replicas applying
the same write count nothing), so a sum over the replicas counts each request once. How far
each replica is behind memory's write log is `atmosphere_replica_lag{store="ATMO_MEMORY"}`
(`atmosphere.service.replica_metrics`).
"""

from __future__ import annotations

from prometheus_client import Counter

HISTORY_READS = Counter("atmosphere_memory_history_reads", "Pages of conversation history read")
HISTORY_WRITES = Counter(
    "atmosphere_memory_history_writes", "Conversation history writes, by op (append: a turn; replace)", ("op",)
)
HISTORY_APPENDS = HISTORY_WRITES.labels("append")
"""The turns appended (a child resolved once: `labels()` costs microseconds on every run)."""
HISTORY_REPLACES = HISTORY_WRITES.labels("replace")
FACTS = Counter(
    "atmosphere_memory_facts",
    "Facts offered to long-term memory, by outcome (stored; flagged: stored with the screen's warning; "
    "dropped: refused by the screen, or not screened)",
    ("outcome",),
)
FACT_RECALLS = Counter("atmosphere_memory_fact_recalls", "Requests for a user's long-term facts")


def facts_saved(*, offered: int, kept: int, flagged: int) -> None:
    """Count one save: `offered` facts, `kept` of them passed the screen, `flagged` of those with a warning."""
    FACTS.labels("stored").inc(kept - flagged)
    FACTS.labels("flagged").inc(flagged)
    FACTS.labels("dropped").inc(offered - kept)
