"""What one run tells operators: its metrics, its trace's spans, and the model-call observer.

A `RunTelemetry` is made with each `Run` and fed by its one event path (`EventOutput`): the
first text delta is the TTFT, usage events count tokens, the terminal event ends the response
and the run's span. With tracing on, the run's span (`invoke_agent <agent>`) continues the
`traceparent` the run was submitted with; each model call of the built-in runtime is a
`chat <model>` span (from the model-lifecycle hooks, `atmosphere.sdk.lifecycle`), each tool call an
`execute_tool <tool>` span, and the bus's requests (governance, memory, the sandbox) children of
whichever is current. Off, the per-token cost is one counter increment.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from urllib.parse import urlsplit

from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from atmosphere.bus.errors import (
    ProviderEmptyAnswerError,
    ProviderError,
    ProviderMalformedError,
    ProviderMisconfiguredError,
    ProviderRateLimitedError,
    ProviderRejectedError,
    ProviderTimeoutError,
    ProviderTooLargeError,
    ProviderUnavailableError,
    ResponseBlockedError,
    RuntimeUnavailableError,
)
from atmosphere.contracts.common.v1.common_pb2 import Usage
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.dispatch import metrics
from atmosphere.dispatch.errors import CONTEXT_OVERFLOW
from atmosphere.dispatch.run_scope import RunScope
from atmosphere.dispatch.tool_errors import ERROR_PREFIX
from atmosphere.sdk import TokenUsage
from atmosphere.sdk.lifecycle import AgentLifecycleListener, ModelCall
from atmosphere.sdk.runtime import AgentRuntime, ToolCallRequest
from atmosphere.service import telemetry

log = logging.getLogger("atmosphere.dispatch")

ERROR_TYPES = {
    # The seed's error types (`atmosphere.ai.errors.total`), from the codes runs end with.
    ProviderRateLimitedError.code: "rate_limit",
    ProviderTimeoutError.code: "timeout",
    ProviderError.code: "server_error",
    ProviderUnavailableError.code: "unavailable",
    RuntimeUnavailableError.code: "unavailable",
    ProviderMisconfiguredError.code: "auth",
    ProviderTooLargeError.code: "context_length",
    ResponseBlockedError.code: "content_filter",
    ProviderRejectedError.code: "invalid_request",
    ProviderMalformedError.code: "stream_error",
    ProviderEmptyAnswerError.code: "stream_error",
}


def error_type(error_code: str, provider_code: str = "") -> str:
    """The seed's error type of a run that ended with `error_code` (`unknown` for the others)."""
    if provider_code == CONTEXT_OVERFLOW:
        return "context_length"
    if provider_code == "content_filter":
        return "content_filter"
    return ERROR_TYPES.get(error_code, "unknown")


def provider_of(runtime: AgentRuntime | None) -> str:
    """Where `runtime` sends its model calls: its base URL's host, else the runtime's name."""
    if runtime is None:
        return ""
    url = urlsplit(runtime.config.base_url or "")
    if not url.hostname:
        return runtime.name
    # The host and port only: a URL's login (`https://user:key@host`) is never a label.
    return f"{url.hostname}:{url.port}" if url.port else url.hostname


class RunTelemetry:
    """One run's metrics and spans (see the module)."""

    def __init__(self, *, agent: str, runtime: AgentRuntime | None, model: str, run_id: str, traceparent: str) -> None:
        """Count under `agent`/`runtime`/`model`; the span continues `traceparent` when tracing is on."""
        self.agent = agent
        self.runtime_name = runtime.name if runtime is not None else ""
        self.run_id = run_id
        self._traceparent = traceparent
        self._series = metrics.run_series(agent, self.runtime_name, provider_of(runtime), model)
        self._started = time.perf_counter()
        self._texts = 0
        self._input_tokens = 0
        self._output_tokens = 0
        self.span: Span | None = None

    @classmethod
    def of(cls, scope: RunScope) -> RunTelemetry:
        """The telemetry of the run `scope` describes."""
        request = scope.request
        runtime = scope.services.model_side.runtime
        return cls(
            agent=scope.spec.name,
            runtime=runtime,
            model=scope.model,
            run_id=request.run_id,
            traceparent=request.traceparent,
        )

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The run's lifetime: an active session, and its span (the current one while it runs)."""
        active = self._series.active_sessions
        active.inc()
        try:
            if not telemetry.active():  # the common case: no span to make, not even a no-op one
                yield
                return
            attributes = {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": self.agent,
                "gen_ai.provider.name": self.runtime_name,
                "atmosphere.run.id": self.run_id,
            }
            name = f"invoke_agent {self.agent}"
            with telemetry.span(name, attributes=attributes, traceparent=self._traceparent) as span:
                self.span = span
                yield
        finally:
            active.dec()

    def prompted(self) -> None:
        """A model exchange begins."""
        self._series.prompts.inc()

    def text(self) -> None:
        """A text delta of the answer went out: counted here, added to the series when the run ends.

        The first one is the TTFT. Per token, that is the whole cost of the run's telemetry.
        """
        self._texts += 1
        if self._texts == 1:
            self._series.prompt_duration.observe(time.perf_counter() - self._started)

    def usage(self, usage: Usage) -> None:
        """A usage event: the provider's token counts."""
        series = self._series
        if usage.input_tokens:
            series.input_tokens.inc(usage.input_tokens)
        if usage.output_tokens:
            series.output_tokens.inc(usage.output_tokens)
        if usage.cached_input_tokens:  # the series is absent when the provider reports no cache hits
            series.cached_input_tokens().inc(usage.cached_input_tokens)
        self._input_tokens += usage.input_tokens
        self._output_tokens += usage.output_tokens
        if self.span is not None:  # the run's totals, over all its model calls
            self.span.set_attribute("gen_ai.usage.input_tokens", self._input_tokens)
            self.span.set_attribute("gen_ai.usage.output_tokens", self._output_tokens)

    def ended(self, event: RunEvent) -> None:
        """The terminal event went out: the texts, the response's duration, the outcome, the span's status."""
        series = self._series
        elapsed = time.perf_counter() - self._started
        if self._texts:  # nothing is written after the terminal event: the count is whole
            series.streaming_texts.inc(self._texts)
        series.response_duration.observe(elapsed)
        kind = event.WhichOneof("kind")
        # A failed run has its WARNING line (`log_failed`); each run's end is there at DEBUG.
        log.debug("run %s ended (%s) in %.0f ms", self.run_id, kind, elapsed * 1000)
        if kind == "complete":
            series.complete.inc()
            if self.span is not None and event.complete.finish_reason:
                self.span.set_attribute("gen_ai.response.finish_reasons", [event.complete.finish_reason])
            return
        code = event.error.code or "unknown"
        series.failed(code, error_type(code, event.error.details.get("provider_code", "")))
        if self.span is not None:
            self.span.set_status(Status(StatusCode.ERROR, code))
            self.span.set_attribute("error.type", code)

    async def tool_call(self, call: ToolCallRequest, run: Callable[[ToolCallRequest], Awaitable[str]]) -> str:
        """`run` one tool call: its duration and outcome (an `Error: ...` result is an error), its span."""
        started = time.perf_counter()
        outcome = "error"
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.call_id,
        }
        try:
            with telemetry.span(f"execute_tool {call.name}", attributes=attributes) as span:
                result = await run(call)
                if not result.startswith(ERROR_PREFIX):
                    outcome = "ok"
                elif span is not None:
                    span.set_status(Status(StatusCode.ERROR, "the tool answered an error"))
            return result
        finally:
            metrics.TOOL_DURATION.labels(self.agent, call.name, outcome).observe(time.perf_counter() - started)

    def model_listener(self) -> AgentLifecycleListener:
        """The observer of this run's model calls: GenAI metrics, and a `chat` span per call."""
        return _ModelCalls(self)


class _ModelCalls(AgentLifecycleListener):
    """`chat <model>` spans and the GenAI client metrics, from the built-in runtime's hooks."""

    def __init__(self, run: RunTelemetry) -> None:
        self._run = run
        self._spans: dict[int, Span] = {}

    def on_model_start(self, call: ModelCall) -> None:
        if self._run.span is None:
            return
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": call.provider,
            "gen_ai.system": call.provider,
            "gen_ai.request.model": call.model,
            "gen_ai.agent.name": call.agent,
        }
        span = telemetry.start_span(f"chat {call.model}", kind=SpanKind.CLIENT, attributes=attributes)
        if span is not None:
            self._spans[id(call)] = span

    def on_model_end(self, call: ModelCall, usage: TokenUsage | None, duration_ms: float) -> None:
        metrics.gen_ai_duration("chat", call.provider, call.model).observe(duration_ms / 1000)
        if usage is not None:
            for kind, count in (("input", usage.input), ("output", usage.output), ("cached_input", usage.cached_input)):
                if count:
                    metrics.gen_ai_tokens("chat", call.provider, call.model, kind).observe(count)
        span = self._spans.pop(id(call), None)
        if span is None:
            return
        if usage is not None:
            span.set_attribute("gen_ai.usage.input_tokens", usage.input)
            span.set_attribute("gen_ai.usage.output_tokens", usage.output)
            span.set_attribute("gen_ai.usage.total_tokens", usage.total or usage.input + usage.output)
            if usage.model:  # runtime truth: no placeholder when the provider named none
                span.set_attribute("gen_ai.response.model", usage.model)
        span.end()

    def on_model_error(self, call: ModelCall, error: BaseException) -> None:
        span = self._spans.pop(id(call), None)
        if span is None:
            return
        code = getattr(error, "code", "") or type(error).__name__
        span.set_status(Status(StatusCode.ERROR, str(code)))
        span.set_attribute("error.type", str(code))
        span.end()
