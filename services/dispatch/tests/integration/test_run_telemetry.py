"""A run's telemetry through the real services (the agent test kit): its spans, series and model hooks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY

from atmosphere.bus import telemetry as bus_telemetry
from atmosphere.dispatch.run_telemetry import error_type, provider_of
from atmosphere.dispatch.runtime.openai import BuiltInAgentRuntime
from atmosphere.sdk import App, TokenUsage, agent, tool
from atmosphere.sdk.lifecycle import AgentLifecycleListener, ModelCall
from atmosphere.sdk.runtime import RuntimeConfig
from atmosphere.service import telemetry
from atmosphere.testing import AgentTestEnv, ScriptedModel, ToolCallScript, Turn


@tool
def shout(word: str) -> str:
    """Say `word` loudly.

    Args:
        word: What to say.
    """
    return word.upper()


class Recorder(AgentLifecycleListener):
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def on_model_start(self, call: ModelCall) -> None:
        self.calls.append(("start", call.agent, call.provider, str(call.tool_count)))

    def on_model_end(self, call: ModelCall, usage: TokenUsage | None, duration_ms: float) -> None:
        assert duration_ms >= 0
        self.calls.append(("end", call.agent, str(usage.output if usage else None)))

    def on_model_error(self, call: ModelCall, error: BaseException) -> None:
        self.calls.append(("error", call.agent, type(error).__name__))


class Broken(AgentLifecycleListener):
    """A listener that fails: logged and skipped, never the run's end."""

    def on_model_start(self, call: ModelCall) -> None:
        raise RuntimeError("observer bug")

    def on_model_end(self, call: ModelCall, usage: TokenUsage | None, duration_ms: float) -> None:
        raise RuntimeError("observer bug")


@agent(name="loud", tools=[shout], harness=[])
class Loud:
    pass


RECORDER = Recorder()
APP = App(agents=[Loud], listeners=[Broken(), RECORDER])


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.install_provider(provider)
    try:
        yield exporter
    finally:
        telemetry.install_provider(None)
        provider.shutdown()


def sample(name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (counters are process-wide: compare deltas)."""
    wanted = set(labels.items())
    return sum(
        s.value
        for family in REGISTRY.collect()
        for s in family.samples
        if s.name == name and wanted <= set(s.labels.items())
    )


async def test_a_run_is_one_trace_of_its_model_calls_tool_and_requests(spans: InMemorySpanExporter) -> None:
    model = ScriptedModel(
        Turn.tool_calls(ToolCallScript("shout", {"word": "hey"}, call_id="call_1")), Turn.text("HEY", usage=(7, 2))
    )
    labels = {"agent": "loud", "runtime": "built-in"}
    prompts = sample("atmosphere_ai_prompts_total", **labels)
    tools = sample("atmosphere_ai_tool_duration_seconds_count", agent="loud", tool="shout", outcome="ok")
    provider = telemetry.provider()
    assert provider is not None
    async with AgentTestEnv(APP, model=model) as env:
        with provider.get_tracer("test").start_as_current_span("caller") as caller:
            result = await env.run("loud", "say hey")
    assert result.completed, result.frames
    assert result.text == "HEY"

    finished = spans.get_finished_spans()
    trace_id = caller.get_span_context().trace_id
    assert {s.context.trace_id for s in finished} == {trace_id}
    by_name = {s.name: s for s in finished}
    run = by_name["invoke_agent loud"]
    assert run.attributes is not None
    assert run.attributes["gen_ai.usage.input_tokens"] == 10 + 7
    chats = [s for s in finished if s.name.startswith("chat ")]
    assert [s.attributes["gen_ai.usage.output_tokens"] for s in chats if s.attributes] == [5, 2]
    assert all(s.parent is not None and s.parent.span_id == run.context.span_id for s in chats)
    tool_span = by_name["execute_tool shout"]
    assert tool_span.parent is not None
    assert tool_span.parent.span_id == run.context.span_id
    # The sandbox handled the tool's request as a child of the tool call's own request span.
    handled = by_name["handle tool"]
    assert handled.parent is not None
    assert by_name["request tool"].parent is not None
    assert by_name["request tool"].parent.span_id == tool_span.context.span_id
    assert any(s.name == "handle gov.admit" for s in finished)

    assert sample("atmosphere_ai_prompts_total", **labels) - prompts == 1
    after = sample("atmosphere_ai_tool_duration_seconds_count", agent="loud", tool="shout", outcome="ok")
    assert after - tools == 1
    # Both model calls reached the app's listener, the one that raises notwithstanding.
    assert RECORDER.calls[-4:] == [
        ("start", "loud", "built-in", "1"),
        ("end", "loud", "5"),
        ("start", "loud", "built-in", "1"),
        ("end", "loud", "2"),
    ]


async def test_with_tracing_off_nothing_is_traced_and_the_run_goes_on(spans: InMemorySpanExporter) -> None:
    telemetry.install_provider(None)  # what a process without OTEL_* runs with
    assert bus_telemetry.tracer() is None  # the bus sends no traceparent, opens no span
    with telemetry.span("anything") as span:
        assert span is None
    model = ScriptedModel(Turn.text("quiet"))
    async with AgentTestEnv(APP, model=model) as env:
        result = await env.run("loud", "hush")
    assert result.completed
    assert spans.get_finished_spans() == ()


@pytest.mark.parametrize(
    ("code", "provider_code", "kind"),
    [
        ("provider.rate_limited", "", "rate_limit"),
        ("provider.timeout", "", "timeout"),
        ("provider.rejected", "context_length_exceeded", "context_length"),
        ("provider.rejected", "", "invalid_request"),
        ("governance.response_blocked", "", "content_filter"),
        ("agent.failed", "", "unknown"),
    ],
)
def test_a_failed_runs_error_type_is_the_seeds(code: str, provider_code: str, kind: str) -> None:
    assert error_type(code, provider_code) == kind


def test_the_provider_label_names_the_host_never_a_login() -> None:

    def label(base_url: str | None) -> str:
        return provider_of(BuiltInAgentRuntime(RuntimeConfig(base_url=base_url)))

    assert label("https://user:sk-secret@api.example.com/v1") == "api.example.com"
    assert label("http://127.0.0.1:8090/v1") == "127.0.0.1:8090"
    assert label(None) == "built-in"
    assert provider_of(None) == ""
