"""Dispatch's Prometheus series: the seed's `atmosphere.ai.*` set, GenAI client metrics, the run queue's.

The GenAI series follow OpenTelemetry's GenAI convention; the queue's are what its operator needs.

Every `atmosphere_ai_*` series is tagged with `agent`, `runtime`, `provider` (the host the
runtime sends model calls to, as the deployment configured it) and `model`, all named by the
deployment, never by a client. Timers are histograms (Prometheus computes p50/p95/p99 from
their buckets, over any window and across replicas).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from prometheus_client import Counter, Gauge, Histogram

from atmosphere.service.telemetry import LATENCY_BUCKETS

AI_LABELS = ("agent", "runtime", "provider", "model")

PROMPTS = Counter("atmosphere_ai_prompts", "Prompt requests: model exchanges started", AI_LABELS)
STREAMING_TEXTS = Counter("atmosphere_ai_streaming_texts", "Streamed text chunks of the answers", AI_LABELS)
ERRORS = Counter(
    "atmosphere_ai_errors",
    "Runs ended by an error, by type (rate_limit, timeout, server_error, unavailable, auth, context_length, "
    "content_filter, invalid_request, stream_error, unknown)",
    (*AI_LABELS, "type"),
)
PROMPT_DURATION = Histogram(
    "atmosphere_ai_prompt_duration_seconds",
    "Time from the prompt to the first streamed text (TTFT)",
    AI_LABELS,
    buckets=LATENCY_BUCKETS,
)
RESPONSE_DURATION = Histogram(
    "atmosphere_ai_response_duration_seconds", "Whole response wall-clock time", AI_LABELS, buckets=LATENCY_BUCKETS
)
TOOL_DURATION = Histogram(
    "atmosphere_ai_tool_duration_seconds",
    "Tool call execution time, by tool and outcome (ok, error)",
    ("agent", "tool", "outcome"),
    buckets=LATENCY_BUCKETS,
)
ACTIVE_SESSIONS = Gauge("atmosphere_ai_active_sessions", "Runs being answered now", ("agent",))
TOKENS = Counter(
    "atmosphere_ai_tokens", "Provider-reported tokens by type (input, output, cached_input)", (*AI_LABELS, "type")
)

GEN_AI_TOKEN_USAGE = Histogram(
    "gen_ai_client_token_usage",
    "Tokens of each model call, by gen_ai.token.type (OpenTelemetry GenAI convention)",
    ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "gen_ai_token_type"),
    buckets=(1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304),
)
GEN_AI_OPERATION_DURATION = Histogram(
    "gen_ai_client_operation_duration_seconds",
    "Time of each model call (OpenTelemetry GenAI convention)",
    ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model"),
    buckets=LATENCY_BUCKETS,
)

RUNS = Counter(
    "atmosphere_runs", "Runs ended, by agent and outcome (complete, or the error's code)", ("agent", "outcome")
)
REDELIVERIES = Counter(
    "atmosphere_run_redeliveries", "Runs delivered again to a worker (the one before died, stalled or stopped)"
)
RUN_QUEUE_DEPTH = Gauge(
    "atmosphere_run_queue_depth", "Runs queued and not yet acknowledged, by pool and nesting level", ("pool", "level")
)
JOURNAL_APPENDS = Counter("atmosphere_journal_appends", "Records appended to durable runs' journals", ("kind",))
JOURNAL_RESUMES = Counter("atmosphere_journal_resumes", "Durable runs resumed from their journal by another delivery")


@dataclass(frozen=True)
class RunSeries:
    """The series one run counts in, resolved once per label set.

    `labels()` costs microseconds (validation, a lock); a run touches a dozen series, so each
    label set's children are looked up once for the process (`run_series`) instead of per run.
    """

    agent: str
    labels: tuple[str, str, str, str]
    prompts: Counter
    streaming_texts: Counter
    prompt_duration: Histogram
    response_duration: Histogram
    input_tokens: Counter
    output_tokens: Counter
    active_sessions: Gauge
    complete: Counter

    def cached_input_tokens(self) -> Counter:
        """The cached-input tokens' series (made only when a provider reports cache hits)."""
        return TOKENS.labels(*self.labels, "cached_input")

    def failed(self, code: str, error_type: str) -> None:
        """Count a run ended by the error `code`, of the seed's `error_type`."""
        RUNS.labels(self.agent, code).inc()
        ERRORS.labels(*self.labels, error_type).inc()


@cache
def run_series(agent: str, runtime: str, provider: str, model: str) -> RunSeries:
    """The series of runs of `agent` on `runtime`, `provider` and `model` (deployment-named: bounded)."""
    labels = (agent, runtime, provider, model)
    return RunSeries(
        agent=agent,
        labels=labels,
        prompts=PROMPTS.labels(*labels),
        streaming_texts=STREAMING_TEXTS.labels(*labels),
        prompt_duration=PROMPT_DURATION.labels(*labels),
        response_duration=RESPONSE_DURATION.labels(*labels),
        input_tokens=TOKENS.labels(*labels, "input"),
        output_tokens=TOKENS.labels(*labels, "output"),
        active_sessions=ACTIVE_SESSIONS.labels(agent),
        complete=RUNS.labels(agent, "complete"),
    )


@cache
def gen_ai_duration(operation: str, provider: str, model: str) -> Histogram:
    """`gen_ai_client_operation_duration_seconds` of one operation, provider and model (resolved once)."""
    return GEN_AI_OPERATION_DURATION.labels(operation, provider, model)


@cache
def gen_ai_tokens(operation: str, provider: str, model: str, token_type: str) -> Histogram:
    """`gen_ai_client_token_usage` of one operation, provider, model and token type (resolved once)."""
    return GEN_AI_TOKEN_USAGE.labels(operation, provider, model, token_type)
