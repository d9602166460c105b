"""What only Cohere's v2 Chat API has: its request shapes, finish reasons, errors and settings."""

from __future__ import annotations

import json
from typing import Any

import pytest

from atmosphere.runtimes.cohere import CohereAgentRuntime
from atmosphere.sdk import AiRequest, ChatMessage, RetryPolicy, ToolLoopPolicy
from atmosphere.sdk.runtime import GenerationOptions, RecordedRound, RecordedToolCall, RuntimeConfig
from atmosphere.testing import ScriptedModel, ToolCallScript, Turn
from atmosphere.testing.runtime_contract import COHERE_WIRE, TIME, WEATHER, City, Recorder, context

QUICK = RetryPolicy(max_retries=2, initial_delay=0.01, max_delay=1.0)


async def run(
    provider: ScriptedModel,
    request: AiRequest,
    recorder: Recorder | None = None,
    config: RuntimeConfig | None = None,
    **overrides: Any,
) -> Recorder:
    recorder = recorder or Recorder()
    runtime = CohereAgentRuntime(config or COHERE_WIRE.config(provider))
    try:
        await runtime.execute(context(recorder, request, **{"retry": QUICK, **overrides}), recorder.session)
    finally:
        await runtime.aclose()
    return recorder


def kinds_of(recorder: Recorder, kind: str) -> list[Any]:
    return [getattr(e, kind) for e in recorder.events if e.WhichOneof("kind") == kind]


# -- finish reasons --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("finish", "expected"),
    [("stop", "stop"), ("STOP_SEQUENCE", "stop"), ("length", "length"), ("SOMETHING_NEW", "stop")],
)
async def test_finish_reasons_are_reported_as_the_built_in_runtime_does(
    fake_provider: ScriptedModel, finish: str, expected: str
) -> None:
    # COMPLETE and STOP_SEQUENCE finished the answer; MAX_TOKENS cut it (`length`), the text stands.
    fake_provider.script(Turn.text("The answer was", finish_reason=finish))
    recorder = await run(fake_provider, AiRequest(message="hi"))
    assert recorder.text() == "The answer was"
    assert recorder.terminal().complete.finish_reason == expected


async def test_a_stream_without_a_finish_reason_completes_as_unknown(fake_provider: ScriptedModel) -> None:
    said = _events(("content-delta", {"delta": {"message": {"content": {"text": "Hi"}}}}), ("message-end", {}))
    fake_provider.script(Turn.raw(*said))
    recorder = await run(fake_provider, AiRequest(message="hi"))
    assert recorder.text() == "Hi"
    assert recorder.terminal().complete.finish_reason == "unknown"


async def test_a_tool_call_cut_at_max_tokens_is_never_run(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn(calls=(ToolCallScript("get_weather", '{"city": "Par'),), finish_reason="length", usage=None)
    )
    recorder = await run(fake_provider, AiRequest(message="?"), tools=(WEATHER,))
    assert recorder.tool_calls == []
    assert recorder.terminal().complete.finish_reason == "length"
    assert len(fake_provider.requests) == 1


async def test_a_generation_error_before_any_output_is_retried(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.stream_error(message="internal failure"), Turn.text("Back."))
    recorder = await run(fake_provider, AiRequest(message="hi"))
    assert recorder.text() == "Back."
    assert len(fake_provider.requests) == 2
    [notice] = [p.message for p in kinds_of(recorder, "progress")]
    assert notice.startswith("Model provider failed mid-stream (ERROR); retrying in")


async def test_a_generation_error_after_text_ends_the_run_in_error(fake_provider: ScriptedModel) -> None:
    said = _events(
        ("content-delta", {"index": 0, "delta": {"message": {"content": {"text": "Half"}}}}),
        ("message-end", {"delta": {"finish_reason": "TIMEOUT", "error": "generation timed out"}}),
    )
    fake_provider.script(Turn.raw(*said), Turn.text("never"))
    recorder = await run(fake_provider, AiRequest(message="hi"))
    assert recorder.text() == "Half"
    error = recorder.terminal().error
    assert (error.code, error.retryable) == ("provider.timeout", True)
    assert error.message == "the provider ended the generation with TIMEOUT: generation timed out"
    assert len(fake_provider.requests) == 1


# -- errors ----------------------------------------------------------------------------------


async def test_a_rate_limit_that_lasts_ends_the_run_retryable(fake_provider: ScriptedModel) -> None:
    fake_provider.script(*[Turn.error("You are past the per minute request limit", status=429) for _ in range(3)])
    recorder = await run(fake_provider, AiRequest(message="hi"))
    error = recorder.terminal().error
    assert error.message == "Failed after 3 attempts: API returned 429: You are past the per minute request limit"
    assert (error.code, error.retryable, error.details["status"]) == ("provider.rate_limited", True, "429")


async def test_a_server_error_is_retried_and_says_so(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.error("upstream down", status=503, retry_after=0.05), Turn.text("Back."))
    recorder = await run(fake_provider, AiRequest(message="hi"))
    assert recorder.text() == "Back."
    [notice] = [p.message for p in kinds_of(recorder, "progress")]
    assert notice.startswith("Model provider failed (503); retrying in")


@pytest.mark.parametrize(("status", "code"), [(401, "provider.rejected"), (498, "provider.rejected")])
async def test_a_refused_credential_is_not_retried(fake_provider: ScriptedModel, status: int, code: str) -> None:
    fake_provider.script(Turn.error("invalid api token", status=status), Turn.text("never"))
    recorder = await run(fake_provider, AiRequest(message="hi"))
    error = recorder.terminal().error
    assert (error.code, error.retryable, error.message) == (code, False, f"API returned {status}: invalid api token")
    assert len(fake_provider.requests) == 1


async def test_a_provider_that_never_answers_fails_at_the_first_byte_deadline(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.silent(2.0))
    config = RuntimeConfig(first_byte_timeout=0.2, extra=COHERE_WIRE.config(fake_provider).extra)
    recorder = await run(fake_provider, AiRequest(message="hi"), config=config, retry=RetryPolicy.NONE)
    error = recorder.terminal().error
    assert (error.code, error.message) == ("provider.timeout", "the model provider did not answer within 0.2 s")


async def test_a_stream_cut_after_text_is_an_error_and_not_retried(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.truncated("Half an"), Turn.text("never"))
    recorder = await run(fake_provider, AiRequest(message="hi"))
    assert recorder.text() == "Half an"
    error = recorder.terminal().error
    assert (error.code, error.retryable) == ("provider.unavailable", True)
    assert error.message == "the provider stream ended before the answer was complete"
    assert len(fake_provider.requests) == 1


async def test_an_answer_without_content_is_an_error(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.empty())
    recorder = await run(fake_provider, AiRequest(message="hi"))
    assert recorder.terminal().error.code == "provider.empty_answer"


async def test_an_unreachable_provider_is_retried_then_fails(fake_provider: ScriptedModel) -> None:
    config = RuntimeConfig(extra={"CO_API_KEY": "k", "COHERE_BASE_URL": "http://127.0.0.1:9"})
    recorder = await run(fake_provider, AiRequest(message="hi"), config=config)
    error = recorder.terminal().error
    assert (error.code, error.retryable) == ("provider.unavailable", True)
    assert error.message.startswith("Failed after 3 attempts: provider connection failed")


# -- the request -----------------------------------------------------------------------------


async def test_tool_calls_and_results_go_back_in_cohere_shape(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(
            ToolCallScript("get_weather", {"city": "Oslo"}, call_id="w1"),
            ToolCallScript("get_time", {"city": "Oslo"}, call_id="t1"),
            text="I will check both.",
        ),
        Turn.text("Cold and late."),
    )
    recorder = Recorder({"get_weather": "-5C", "get_time": "Error: no clock"})
    await run(fake_provider, AiRequest(message="Oslo?"), recorder, tools=(WEATHER, TIME))
    first, second = fake_provider.requests
    assert first["tools"][0] == {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": WEATHER.parameters,
        },
    }
    assert "tool_choice" not in first
    assert second["messages"][1:] == [
        {
            "role": "assistant",
            "tool_plan": "I will check both.",
            "tool_calls": [
                {"id": "w1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
                {"id": "t1", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Oslo"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "w1", "content": "-5C"},
        {"role": "tool", "tool_call_id": "t1", "content": "Error: no clock"},
    ]
    # The tool plan is the round's text: the client sees it as it streams, as with any model.
    assert recorder.text() == "I will check both.Cold and late."


async def test_malformed_arguments_are_repeated_as_an_empty_object(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.tool_calls(ToolCallScript("get_weather", '{"city": ', call_id="w1")), Turn.text("ok"))
    recorder = await run(fake_provider, AiRequest(message="?"), tools=(WEATHER,))
    assert recorder.tool_calls[0].arguments_json == '{"city": '  # the choke point judges what the model sent
    assistant = fake_provider.requests[1]["messages"][1]
    assert assistant["tool_calls"][0]["function"]["arguments"] == "{}"


async def test_the_answer_without_tools_keeps_them_declared_but_withheld(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "X"}, call_id="t1")),
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "Y"}, call_id="t2")),
        Turn.text("Best I can say."),
    )
    recorder = await run(
        fake_provider, AiRequest(message="?"), tools=(WEATHER,), tool_loop=ToolLoopPolicy.max_iterations(1)
    )
    assert recorder.terminal().complete.finish_reason == "stop"
    last = fake_provider.requests[-1]
    assert (last["tool_choice"], [t["function"]["name"] for t in last["tools"]]) == ("NONE", ["get_weather"])
    assert last.last_tool_result == "Error: the tool-call limit for this request was reached; answer with what you have"


async def test_history_and_system_turns(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("ok"))
    history = (
        ChatMessage("system", "Summary: the user likes tea."),
        ChatMessage("user", "Hello."),
        ChatMessage("tool", "a result kept without its call"),
        ChatMessage("assistant", "Yes."),
    )
    await run(fake_provider, AiRequest(message="Tea?", system_prompt="Be kind.", history=history))
    [request] = fake_provider.requests
    assert request["messages"] == [
        {"role": "system", "content": "Be kind.\n\nSummary: the user likes tea."},
        {"role": "user", "content": "Hello."},
        {"role": "user", "content": "a result kept without its call"},
        {"role": "assistant", "content": "Yes."},
        {"role": "user", "content": "Tea?"},
    ]


async def test_sampling_settings_are_sent_in_cohere_names(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("ok"))
    generation = GenerationOptions(temperature=0.2, top_p=0.9, stop=("END",), max_tokens=99)
    config = RuntimeConfig(generation=generation, extra=COHERE_WIRE.config(fake_provider).extra)
    await run(fake_provider, AiRequest(message="hi"), config=config)
    [request] = fake_provider.requests
    assert (request["temperature"], request["p"], request["stop_sequences"], request["max_tokens"]) == (
        0.2,
        0.9,
        ["END"],
        99,
    )
    assert "top_p" not in request


async def test_structured_output_with_tools_uses_instructions(fake_provider: ScriptedModel) -> None:
    # Cohere refuses `response_format` beside `tools`: the schema goes in the system prompt instead.
    fake_provider.script(Turn.text('{"city": "Rome", "temperature": 30}'))
    recorder = await run(fake_provider, AiRequest(message="Weather?", response_format=City), tools=(WEATHER,))
    [request] = fake_provider.requests
    assert "response_format" not in request
    assert "JSON schema" in request["messages"][0]["content"]
    assert recorder.terminal().complete.finish_reason == "stop"


async def test_structured_output_asks_for_a_json_object_with_the_schema(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text('{"city": "Rome", "temperature": 30}'))
    await run(fake_provider, AiRequest(message="Weather?", response_format=City))
    assert fake_provider.requests[0]["response_format"] == {
        "type": "json_object",
        "json_schema": City.model_json_schema(),
    }


async def test_usage_prefers_tokens_and_counts_cache_hits_as_input(fake_provider: ScriptedModel) -> None:
    said = _events(
        ("content-delta", {"index": 0, "delta": {"message": {"content": {"text": "ok"}}}}),
        (
            "message-end",
            {
                "delta": {
                    "finish_reason": "COMPLETE",
                    "usage": {
                        "billed_units": {"input_tokens": 5, "output_tokens": 3},
                        "tokens": {"input_tokens": 250, "output_tokens": 3},
                        "cached_tokens": 200,
                    },
                }
            },
        ),
    )
    fake_provider.script(Turn.raw(*said))
    recorder = await run(fake_provider, AiRequest(message="hi", model="command-x"))
    [usage] = kinds_of(recorder, "usage")
    assert (usage.input_tokens, usage.output_tokens, usage.cached_input_tokens, usage.total_tokens) == (
        250,
        3,
        200,
        253,
    )
    assert usage.model == "command-x"


# -- settings --------------------------------------------------------------------------------


async def test_settings_come_from_extra(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("ok"))
    extra = {
        "COHERE_BASE_URL": fake_provider.root_url,
        "CO_API_URL": "http://sdk.invalid",
        "CO_API_KEY": "co-test",
        "COHERE_MODEL": "command-test",
        "COHERE_MAX_TOKENS": "321",
    }
    config = RuntimeConfig(base_url="http://openai.invalid/v1", model="gpt-x", extra=extra)
    await run(fake_provider, AiRequest(message="hi"), config=config)
    [request] = fake_provider.requests
    assert (request["model"], request["max_tokens"]) == ("command-test", 321)
    assert request.headers["authorization"] == "Bearer co-test"
    assert request.headers["x-fern-sdk-name"] == "cohere"


async def test_a_base_url_alone_sends_no_credential(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("ok"))
    # The SDK's own name for the base URL serves when the runtime's is not set.
    config = RuntimeConfig(extra={"CO_API_URL": fake_provider.root_url})
    runtime = CohereAgentRuntime(config)
    assert runtime.is_available()
    recorder = await run(fake_provider, AiRequest(message="hi", model="command-x"), config=config)
    assert recorder.terminal().WhichOneof("kind") == "complete"
    [request] = fake_provider.requests
    assert "authorization" not in request.headers
    assert request["model"] == "command-x"  # the request's own model wins
    assert "max_tokens" not in request  # none set: the model's own limit


async def test_models_list_asks_for_the_chat_models(fake_provider: ScriptedModel) -> None:
    fake_provider.models = ("command-a-03-2025", "command-r7b-12-2024")
    runtime = CohereAgentRuntime(RuntimeConfig(extra={"COHERE_BASE_URL": fake_provider.root_url}))
    try:
        assert await runtime.list_models() == ["command-a-03-2025", "command-r7b-12-2024"]
    finally:
        await runtime.aclose()


def test_availability_and_defaults() -> None:
    assert not CohereAgentRuntime(RuntimeConfig(base_url="http://openai.example/v1", api_key="k")).is_available()
    assert CohereAgentRuntime(RuntimeConfig(extra={"CO_API_KEY": "k"})).is_available()
    assert not CohereAgentRuntime(RuntimeConfig(extra={"COHERE_BASE_URL": "ftp://x"})).is_available()
    runtime = CohereAgentRuntime(RuntimeConfig(extra={"CO_API_KEY": "k", "COHERE_MAX_TOKENS": "lots"}))
    assert (runtime.settings.max_tokens, runtime.settings.model) == (None, "command-a-03-2025")
    llm_limit = RuntimeConfig(generation=GenerationOptions(max_tokens=77), extra={"CO_API_KEY": "k"})
    assert CohereAgentRuntime(llm_limit).settings.max_tokens == 77
    assert (CohereAgentRuntime.name, CohereAgentRuntime.priority) == ("cohere", 100)
    assert not CohereAgentRuntime.hosts(object())


# -- durable runs ----------------------------------------------------------------------------


class _Round:
    def __init__(self, rounds: _Rounds, recorded: RecordedRound | None) -> None:
        self._rounds = rounds
        self.recorded = recorded

    async def commit(self, result: RecordedRound) -> None:
        self._rounds.committed.append(result)


class _Rounds:
    def __init__(self, *recorded: RecordedRound) -> None:
        self._recorded = list(recorded)
        self.committed: list[RecordedRound] = []

    async def next_round(self) -> _Round:
        return _Round(self, self._recorded.pop(0) if self._recorded else None)


async def test_a_durable_run_replays_committed_rounds_and_commits_live_ones(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("It is cold."))
    asked = RecordedRound(
        tool_calls=(RecordedToolCall("w_r", "get_weather", '{"city": "Oslo"}'),), finish_reason="TOOL_CALL"
    )
    rounds = _Rounds(asked)
    recorder = await run(fake_provider, AiRequest(message="Oslo?"), tools=(WEATHER,), rounds=rounds)
    assert [c.call_id for c in recorder.tool_calls] == ["w_r"]
    assert len(fake_provider.requests) == 1  # the recorded round was not asked again
    assert fake_provider.requests[0].last_tool_result == "result of get_weather"
    [live] = rounds.committed
    assert (live.text, live.finish_reason) == ("It is cold.", "COMPLETE")
    assert [p.text for p in live.pieces] == ["It ", "is ", "cold."]
    assert recorder.text() == "It is cold."


def _events(*events: tuple[str, dict[str, Any]]) -> list[str]:
    """Raw Cohere events (each `{"type": kind, **data}`), a `message-start` first."""
    start = {"type": "message-start", "id": "m1", "delta": {"message": {"role": "assistant"}}}
    return [json.dumps(start), *(json.dumps({"type": kind, **data}) for kind, data in events)]


async def test_an_event_the_sdk_cannot_read_leaves_the_answer_incomplete(fake_provider: ScriptedModel) -> None:
    # The SDK skips an event whose data is not JSON (with a warning): the stream then lacks its end.
    fake_provider.script(Turn.malformed("Half"), Turn.text("never"))
    recorder = await run(fake_provider, AiRequest(message="hi"))
    assert recorder.text() == "Half"
    assert recorder.terminal().error.message == "the provider stream ended before the answer was complete"
    assert len(fake_provider.requests) == 1
