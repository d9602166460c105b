"""Governance's Prometheus series: its decisions, the screens' verdicts, what runs cost, the kill switch.

Counted by the replica that took the request (never again when the other replicas apply its
log entry), so a sum over the replicas counts each decision once. Labels are bounded: a kind
is one of governance's checks, a policy is named by the deployment's policy files (or is
`admit-all` / `policy-ring` when no single policy decided), an outcome is the decision's word,
agents and models are the deployment's.
"""

from __future__ import annotations

import time
from functools import cache
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram

from atmosphere.contracts.governance.v1.governance_pb2 import Decision
from atmosphere.service.telemetry import LATENCY_BUCKETS

if TYPE_CHECKING:
    from atmosphere.governance.plane import GovernancePlane

DECISIONS = Counter(
    "atmosphere_governance_decisions",
    "Decisions, by kind (admit, check_tool, check_output), deciding policy and outcome (admit, deny, transform, "
    "prefer)",
    ("kind", "policy", "outcome"),
)
DECISION_DURATION = Histogram(
    "atmosphere_governance_decision_duration_seconds",
    "Time from a check's request to its decision, stored on governance's log (policies and log write)",
    ("kind",),
    buckets=LATENCY_BUCKETS,
)
SCREENS = Counter(
    "atmosphere_governance_screened_texts",
    "Texts through the injection screens, by kind (tool_output, document, fact) and verdict (SAFE, INJECTED, ERROR)",
    ("kind", "verdict"),
)
COST = Histogram(
    "atmosphere_ai_cost",
    "USD a run cost by the pricing table, when governance hears of its end",
    ("agent", "model"),
    buckets=(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 50.0),
)
UNPRICED_RUNS = Counter(
    "atmosphere_governance_unpriced_runs",
    "Runs that used a model the pricing table has no price for (counted as free)",
    ("agent",),
)
KILL_SWITCH = Gauge("atmosphere_governance_kill_switch_armed", "1 while the kill switch is armed on this replica")
HELD_SLOTS = Gauge(
    "atmosphere_governance_held_concurrency_slots", "Admitted runs holding a concurrency-limit slot on this replica"
)


def decided(kind: str, decision: Decision, started: float) -> None:
    """Count `decision` of a `kind` check whose request arrived at `started` (`time.perf_counter()`)."""
    _decision_duration(kind).observe(time.perf_counter() - started)
    _decisions(kind, decision.policy, decision.outcome).inc()


# Each label set's child looked up once: `labels()` costs microseconds, on every check of a run.
@cache
def _decision_duration(kind: str) -> Histogram:
    return DECISION_DURATION.labels(kind)


@cache
def _decisions(kind: str, policy: str, outcome: str) -> Counter:
    return DECISIONS.labels(kind, policy, outcome)


def screened(kind: str, verdict: str) -> None:
    """Count one text of `kind` the screen judged `verdict`."""
    SCREENS.labels(kind, verdict).inc()


def priced(agent: str, model: str, usd: float, *, complete: bool) -> None:
    """Observe one run's cost (`complete`: every model it used had a price)."""
    COST.labels(agent, model).observe(usd)
    if not complete:
        UNPRICED_RUNS.labels(agent).inc()


def observe(plane: GovernancePlane) -> None:
    """Read the kill switch and the held slots from `plane` at each scrape (nothing counted on the request path)."""
    KILL_SWITCH.set_function(lambda: float(plane.kill_switch.armed))
    HELD_SLOTS.set_function(lambda: float(plane.held_slots))
