"""Dispatch's Prometheus series: the seed's `atmosphere.ai.*` set, GenAI client metrics, the run queue's.

The GenAI series follow OpenTelemetry's GenAI convention; the queue's are what its operator needs.

Every `atmosphere_ai_*` series is tagged with `agent`, `runtime`, `provider` (the host the
runtime sends model calls to, as the deployment configured it) and `model`, all named by the
deployment, never by a client. Timers are histograms (Prometheus computes p50/p95/p99 from
their buckets, over any window and across replicas).
"""

from __future__ import annotations

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
