"""Sandbox's Prometheus series: what it ran, how it ended, what it had to stop, its live workers.

A kind is where a call ran: `tool` (the app's `@tool` functions), `code_exec`, `eval`, `mcp`
(a tool of an MCP server the app declares). Outcomes and reasons are a fixed vocabulary
(`OUTCOMES`, `KILL_REASONS`); tool names are left to dispatch's `atmosphere_ai_tool_duration_seconds`.
"""

from __future__ import annotations

import time
from collections.abc import Sized
from typing import Final

from prometheus_client import Counter, Gauge, Histogram

from atmosphere.service.telemetry import LATENCY_BUCKETS

OUTCOMES: Final = ("ok", "error", "timeout", "killed", "approval")
"""`ok`: a result; `error`: an `Error: ...` for the model (bad arguments, the tool raised, the code
exited non-zero); `timeout`: over its time limit; `killed`: stopped for a limit other than time,
or its worker died under it; `approval`: the tool asked for a human's approval first."""
KILL_REASONS: Final = ("timeout", "memory", "pids", "output", "workspace", "crashed", "protocol")
"""Why a worker or an execution was stopped (`crashed`: its process died on its own)."""

EXECUTIONS = Counter(
    "atmosphere_sandbox_executions", "Calls run by the sandbox, by kind and outcome", ("kind", "outcome")
)
EXECUTION_DURATION = Histogram(
    "atmosphere_sandbox_execution_duration_seconds",
    "Time the sandbox took to answer a call (waiting for a worker included), by kind",
    ("kind",),
    buckets=LATENCY_BUCKETS,
)
KILLS = Counter(
    "atmosphere_sandbox_kills",
    "Workers and executions the sandbox stopped (or saw die), by kind and reason",
    ("kind", "reason"),
)
WORKERS = Gauge("atmosphere_sandbox_workers", "Worker processes alive now, by kind (tool, eval)", ("kind",))
CODE_SESSIONS = Gauge("atmosphere_sandbox_code_sessions", "code_exec sandboxes open now (one per run)")


def executed(kind: str, outcome: str, started: float) -> None:
    """Count a call of `kind` that ended with `outcome`, begun at `started` (`time.perf_counter()`)."""
    EXECUTION_DURATION.labels(kind).observe(time.perf_counter() - started)
    EXECUTIONS.labels(kind, outcome).inc()


def killed(kind: str, reason: str) -> None:
    """Count a worker or an execution of `kind` stopped for `reason`."""
    KILLS.labels(kind, reason).inc()


def observe_code_sessions(sessions: Sized) -> None:
    """Read how many code sessions are open from `sessions` at each scrape (they open and close in many places)."""
    CODE_SESSIONS.set_function(lambda: float(len(sessions)))
