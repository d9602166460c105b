"""The run queue's workers: one durable consumer of `ATMO_RUNS` per nesting level, made by the provisioner.

Dispatch pulls runs from them; nobody else uses them. They live here, beside the layout, and
not in dispatch: the provisioner makes them (`JetStreamLayout.consumers`) and the permission
table names them (`atmosphere.bus.permissions`), and neither may depend on a service. Their
limits are dispatch's settings (`RunQueueLimits`), so the provisioner is given dispatch's
settings, and dispatch checks at start that the consumers it binds to have them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from atmosphere.bus import subjects
from atmosphere.bus._jetstream import ConsumerSpec
from atmosphere.bus.runs import MAX_NESTING

__all__ = ["WORKERS", "RunQueueLimits", "consumers", "durable_name"]

WORKERS = "dispatch"
"""The durable consumer of top-level runs; sub-runs of level n have `dispatch-nested-<n>`."""
MIN_ACK_PENDING = 1000
"""The fewest runs a worker consumer hands out unacknowledged (JetStream's default)."""


@dataclass(frozen=True, slots=True)
class RunQueueLimits:
    """What the run queue's consumers are configured with (dispatch's settings)."""

    ack_wait_seconds: float = 4.0
    """Seconds without a heartbeat after which a run goes to another worker (dispatch's
    `run_ack_wait`, 4 s by default in both modes)."""
    max_deliver: int = 20
    """Deliveries of one run at most: a backstop behind dispatch's own `max_run_deliveries` guard."""
    max_ack_pending: int = MIN_ACK_PENDING
    """Runs handed out and not yet acknowledged, across every worker of a level."""

    @classmethod
    def for_workers(
        cls, *, ack_wait_seconds: float, max_run_deliveries: int, max_concurrent_runs: int
    ) -> RunQueueLimits:
        """The limits dispatch's settings ask for.

        A run that keeps failing before dispatch's own guard (which ends it with an error at
        `max_run_deliveries` fruitless deliveries) is not delivered forever, and a durable run
        that keeps progressing gets more; every worker may hold four times its slots.
        """
        return cls(
            ack_wait_seconds=ack_wait_seconds,
            max_deliver=max_run_deliveries * 4,
            max_ack_pending=max(MIN_ACK_PENDING, max_concurrent_runs * 4),
        )


def durable_name(level: int, pool: str = "") -> str:
    """The worker consumer of nesting level `level` (0: top-level runs) of `pool` ("" the default pool)."""
    name = f"{WORKERS}-pool-{subjects.token(pool, what='dispatch pool')}" if pool else WORKERS
    return name if level == 0 else f"{name}-nested-{level}"


def consumers(limits: RunQueueLimits = RunQueueLimits(), *, pools: Iterable[str] = ()) -> tuple[ConsumerSpec, ...]:
    """One worker consumer per nesting level of `ATMO_RUNS` (`subjects.run_submit_level`) per dispatch pool.

    The default pool's, then each of `pools` (the runtimes agents are pinned to): each pool
    pulls only its own agents' runs, so a framework that crashes, hangs or is overloaded holds
    up only the agents it serves. Each level gets its own `max_concurrent_runs` slots, so a
    coordinator waiting on its sub-runs never holds the slot they need: with one shared pool,
    as many coordinators as slots would each wait for a child that no slot is left to run.
    """
    return tuple(
        ConsumerSpec(
            stream=subjects.RUNS_STREAM,
            durable=durable_name(level, pool),
            filter_subject=subjects.run_submit_level(level, pool),
            ack_wait_seconds=limits.ack_wait_seconds,
            max_deliver=limits.max_deliver,
            max_ack_pending=limits.max_ack_pending,
            # Worth a round trip per ack: a run is expensive to run twice.
            confirm_ack=True,
            # A run is handed over the moment it is queued, not when a batch pull expires.
            batch_fetch=False,
            provisioned=True,
        )
        for pool in ("", *sorted(set(pools) - {""}))
        for level in range(MAX_NESTING + 1)
    )
