"""What the contract suite leaves open, for both runtimes on the bridge: error codes, usage per round,
the tool loop's edges, discovery, availability."""

import pytest

from atmosphere.bus import errors
from atmosphere.langchain_bridge import failures
from atmosphere.langchain_bridge.runtime import GraphRuntime
from atmosphere.runtimes.langchain import LangChainAgentRuntime
from atmosphere.runtimes.langgraph import LangGraphAgentRuntime
from atmosphere.sdk import AiRequest, RetryPolicy, ToolLoopPolicy
from atmosphere.sdk.host import AiCapability
from atmosphere.sdk.runtime import GenerationOptions, RuntimeConfig, discover_runtimes
from atmosphere.testing.model_turns import ToolCallScript, Turn
from atmosphere.testing.runtime_contract import WEATHER, Recorder, context
from atmosphere.testing.scripted_model import ScriptedModel


@pytest.fixture(params=[LangChainAgentRuntime, LangGraphAgentRuntime], ids=lambda cls: cls.name)
def runtime_class(request: pytest.FixtureRequest) -> type[GraphRuntime]:
    cls: type[GraphRuntime] = request.param
    return cls


async def run(
    runtime_class: type[GraphRuntime],
    provider: ScriptedModel,
    request: AiRequest,
    recorder: Recorder | None = None,
    **overrides: object,
) -> Recorder:
    recorder = recorder or Recorder()
    runtime = runtime_class(RuntimeConfig(base_url=provider.base_url, model="fake-model"))
    try:
        await runtime.execute(context(recorder, request, **overrides), recorder.session)
    finally:
        await runtime.aclose()
    return recorder


def test_the_codes_are_the_catalogues() -> None:
    assert errors.ToolLoopExhaustedError.code == failures.TOOL_LOOP_EXHAUSTED
    assert errors.ProviderError.code == failures.PROVIDER_ERROR
    assert errors.ProviderRejectedError.code == failures.PROVIDER_REJECTED
    assert errors.ProviderRateLimitedError.code == failures.PROVIDER_RATE_LIMITED
    assert errors.ProviderUnavailableError.code == failures.PROVIDER_UNAVAILABLE
    assert errors.ProviderTimeoutError.code == failures.PROVIDER_TIMEOUT


def test_the_capabilities_are_the_contract_tested_ones(runtime_class: type[GraphRuntime]) -> None:
    # Pinned flag by flag here: the runtimes' contract suites take their expected set from the bridge.
    # No STRUCTURED_OUTPUT / NATIVE_STRUCTURED_OUTPUT (see the runtimes' package docstrings).
    assert runtime_class(RuntimeConfig()).capabilities() == {
        AiCapability.TEXT_STREAMING,
        AiCapability.SYSTEM_PROMPT,
        AiCapability.CONVERSATION_MEMORY,
        AiCapability.TOOL_CALLING,
        AiCapability.TOOL_CALL_DELTA,
        AiCapability.TOKEN_USAGE,
        AiCapability.PER_REQUEST_RETRY,
        AiCapability.CANCELLATION,
        AiCapability.MODEL_ENUMERATION,
    }


def test_it_is_discovered_and_available_only_for_http_urls(runtime_class: type[GraphRuntime]) -> None:
    [runtime] = [
        r for r in discover_runtimes(RuntimeConfig(base_url="https://llm.example/v1")) if r.name == runtime_class.name
    ]
    assert isinstance(runtime, runtime_class)
    assert runtime.priority == 100
    assert runtime.is_available()
    assert runtime.unavailable_reason() == ""
    not_http = runtime_class(RuntimeConfig(base_url="unix:///tmp/llm.sock"))
    assert not not_http.is_available()
    assert not_http.unavailable_reason() == "LLM_BASE_URL is not an http(s) URL"
    unconfigured = runtime_class(RuntimeConfig())
    assert not unconfigured.is_available()
    assert unconfigured.unavailable_reason() == "no model configured: set LLM_BASE_URL"


async def test_a_hosted_object_must_be_a_compiled_graph(runtime_class: type[GraphRuntime]) -> None:
    recorder = Recorder()
    runtime = runtime_class(RuntimeConfig(base_url="http://127.0.0.1:9/v1"))
    hosted = {"langchain": "create_agent's agents", "langgraph": "compiled graphs"}[runtime_class.name]
    try:
        with pytest.raises(TypeError, match=f"^the {runtime_class.name} runtime hosts {hosted}, not object$"):
            await runtime.execute(context(recorder, AiRequest(message="hi"), native=object()), recorder.session)
    finally:
        await runtime.aclose()
    assert runtime.native_tools(object()) == ()
    assert not runtime_class.hosts(object())


@pytest.mark.parametrize(
    ("status", "code", "retryable"),
    [(400, "provider.rejected", False), (503, "provider.unavailable", True), (429, "provider.rate_limited", True)],
)
async def test_a_provider_error_ends_the_run_with_the_built_in_runtimes_terminal(
    runtime_class: type[GraphRuntime], fake_provider: ScriptedModel, status: int, code: str, retryable: bool
) -> None:
    fake_provider.script(Turn.error("no luck", status=status))
    recorder = await run(runtime_class, fake_provider, AiRequest(message="hi"), retry=RetryPolicy.NONE)
    error = recorder.terminal().error
    assert (error.message, error.code, error.retryable) == (f"API returned {status}: no luck", code, retryable)


async def test_a_strict_loop_ends_with_the_catalogue_code(
    runtime_class: type[GraphRuntime], fake_provider: ScriptedModel
) -> None:
    fake_provider.script(*[Turn.tool_calls(ToolCallScript("get_weather", {"city": "X"})) for _ in range(2)])
    recorder = await run(
        runtime_class, fake_provider, AiRequest(message="loop"), tools=(WEATHER,), tool_loop=ToolLoopPolicy.strict(1)
    )
    error = recorder.terminal().error
    assert (error.message, error.code) == ("Tool loop exhausted after 1 iterations", "runtime.tool_loop_exhausted")


async def test_usage_is_reported_once_per_round_before_the_terminal(
    runtime_class: type[GraphRuntime], fake_provider: ScriptedModel
) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "Oslo"}), usage=(7, 2)),
        Turn.text("Cold.", usage=(11, 3)),
    )
    recorder = await run(runtime_class, fake_provider, AiRequest(message="Oslo?"), tools=(WEATHER,))
    usage = [
        (e.usage.input_tokens, e.usage.output_tokens, e.usage.model) for e in recorder.events if e.usage.ByteSize()
    ]
    assert usage == [(7, 2, "fake-model"), (11, 3, "fake-model")]
    assert recorder.kinds()[-1] == "complete"


async def test_tools_asked_for_after_they_were_withdrawn_are_not_run(
    runtime_class: type[GraphRuntime], fake_provider: ScriptedModel
) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "X"})),
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "Y"})),
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "Z"})),  # a model that ignores the withdrawal
    )
    recorder = await run(
        runtime_class,
        fake_provider,
        AiRequest(message="loop"),
        tools=(WEATHER,),
        tool_loop=ToolLoopPolicy.max_iterations(1),
    )
    assert [c.arguments_json for c in recorder.tool_calls] == ['{"city": "X"}']
    assert fake_provider.requests[2].last_tool_result == (
        "Error: the tool-call limit for this request was reached; answer with what you have"
    )
    assert recorder.terminal().WhichOneof("kind") == "complete"


async def test_without_a_tool_runner_calls_are_refused_not_run(
    runtime_class: type[GraphRuntime], fake_provider: ScriptedModel
) -> None:
    fake_provider.script(Turn.tool_calls(ToolCallScript("get_weather", {"city": "X"})), Turn.text("Sorry."))
    recorder = await run(runtime_class, fake_provider, AiRequest(message="?"), tools=(WEATHER,), run_tool=None)
    assert fake_provider.requests[1].last_tool_result == "Error: no tool runner is attached to this run"
    assert recorder.text() == "Sorry."


async def test_the_generation_options_and_the_request_model_reach_the_provider(
    runtime_class: type[GraphRuntime], fake_provider: ScriptedModel
) -> None:
    fake_provider.script(Turn.text("ok"))
    generation = GenerationOptions(temperature=0.2, max_tokens=64, top_p=0.9, stop=("END",))
    runtime = runtime_class(
        RuntimeConfig(base_url=fake_provider.base_url, api_key="sk-test", model="fake-model", generation=generation)
    )
    recorder = Recorder()
    try:
        await runtime.execute(context(recorder, AiRequest(message="hi", model="other-model")), recorder.session)
    finally:
        await runtime.aclose()
    body = fake_provider.requests[0]
    assert (body["model"], body["temperature"], body["top_p"], body["stop"]) == ("other-model", 0.2, 0.9, ["END"])
    assert body["max_completion_tokens"] == 64
    assert fake_provider.headers[0]["authorization"] == "Bearer sk-test"
