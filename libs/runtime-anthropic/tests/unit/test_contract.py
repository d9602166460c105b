"""The runtime contract on Anthropic's wire, and what only Anthropic's Messages API has."""

from __future__ import annotations

import json
from typing import Any

from atmosphere.runtimes.anthropic import AnthropicAgentRuntime
from atmosphere.sdk import AiRequest, CacheHint, ChatMessage, PromptCache, RetryPolicy, ToolLoopPolicy
from atmosphere.sdk.host import AiCapability
from atmosphere.sdk.runtime import AgentRuntime, RecordedRound, RecordedToolCall, RuntimeConfig
from atmosphere.testing import ScriptedModel, ToolCallScript, Turn
from atmosphere.testing.runtime_contract import (
    ANTHROPIC_WIRE,
    TIME,
    WEATHER,
    AgentRuntimeContract,
    Recorder,
    context,
)


class TestAnthropicRuntimeContract(AgentRuntimeContract):
    wire = ANTHROPIC_WIRE
    expected_capabilities = frozenset(
        {
            AiCapability.TEXT_STREAMING,
            AiCapability.SYSTEM_PROMPT,
            AiCapability.CONVERSATION_MEMORY,
            AiCapability.TOOL_CALLING,
            AiCapability.TOOL_CALL_DELTA,
            AiCapability.TOKEN_USAGE,
            AiCapability.PER_REQUEST_RETRY,
            AiCapability.CANCELLATION,
            AiCapability.STRUCTURED_OUTPUT,
            AiCapability.NATIVE_STRUCTURED_OUTPUT,
            AiCapability.MODEL_ENUMERATION,
        }
    )

    def make_runtime(self, config: RuntimeConfig) -> AgentRuntime:
        return AnthropicAgentRuntime(config)


QUICK = RetryPolicy(max_retries=2, initial_delay=0.01, max_delay=1.0)


async def run(
    provider: ScriptedModel, request: AiRequest, recorder: Recorder | None = None, **overrides: Any
) -> Recorder:
    recorder = recorder or Recorder()
    runtime = AnthropicAgentRuntime(ANTHROPIC_WIRE.config(provider))
    try:
        await runtime.execute(context(recorder, request, **{"retry": QUICK, **overrides}), recorder.session)
    finally:
        await runtime.aclose()
    return recorder


def kinds_of(recorder: Recorder, kind: str) -> list[Any]:
    return [getattr(e, kind) for e in recorder.events if e.WhichOneof("kind") == kind]


async def test_a_max_tokens_stop_is_not_a_finished_answer(fake_provider: ScriptedModel) -> None:
    # The text streamed so far stands, but the terminal says it was cut: `length`, never `stop`.
    fake_provider.script(Turn.text("The answer was", finish_reason="length"))
    recorder = await run(fake_provider, AiRequest(message="hi"))
    assert recorder.text() == "The answer was"
    assert recorder.terminal().complete.finish_reason == "length"


async def test_a_tool_call_cut_at_max_tokens_is_never_run(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn(calls=(ToolCallScript("get_weather", '{"city": "Par'),), finish_reason="length", usage=None)
    )
    recorder = await run(fake_provider, AiRequest(message="?"), tools=(WEATHER,))
    assert recorder.tool_calls == []
    assert recorder.terminal().complete.finish_reason == "length"
    assert len(fake_provider.requests) == 1


async def test_a_refusal_is_reported_as_the_providers_filter(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("I can't", finish_reason="refusal"))
    recorder = await run(fake_provider, AiRequest(message="hi"))
    assert recorder.terminal().complete.finish_reason == "content_filter"


async def test_an_end_turn_or_stop_sequence_is_a_finished_answer(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("Done."), Turn.text("Up to", finish_reason="stop_sequence"))
    first = await run(fake_provider, AiRequest(message="hi"))
    second = await run(fake_provider, AiRequest(message="hi"))
    assert first.terminal().complete.finish_reason == "stop"
    assert second.terminal().complete.finish_reason == "stop"


async def test_a_paused_turn_is_an_error(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("Searching", finish_reason="pause_turn"))
    recorder = await run(fake_provider, AiRequest(message="hi"))
    assert "pause_turn" in recorder.terminal().error.message


async def test_overloaded_529_is_retried_honoring_retry_after(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.error("Overloaded", status=529, retry_after=0.05), Turn.text("Back."))
    recorder = await run(fake_provider, AiRequest(message="hi"))
    assert recorder.text() == "Back."
    assert recorder.terminal().WhichOneof("kind") == "complete"
    assert len(fake_provider.requests) == 2
    [notice] = [p.message for p in kinds_of(recorder, "progress")]
    assert notice.startswith("Model provider is overloaded (529); retrying in")


async def test_an_overloaded_error_event_before_any_output_is_retried(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.stream_error(message="Overloaded", error_type="overloaded_error"), Turn.text("Back."))
    recorder = await run(fake_provider, AiRequest(message="hi"))
    assert recorder.text() == "Back."
    assert len(fake_provider.requests) == 2


async def test_overload_that_lasts_ends_the_run_retryable(fake_provider: ScriptedModel) -> None:
    fake_provider.script(*[Turn.error("Overloaded", status=529) for _ in range(3)])
    recorder = await run(fake_provider, AiRequest(message="hi"))
    error = recorder.terminal().error
    assert error.message == "Failed after 3 attempts: API returned 529: Overloaded"
    assert (error.code, error.retryable, error.details["status"]) == ("provider.unavailable", True, "529")
    assert error.details["provider_code"] == "overloaded_error"


async def test_a_rejected_request_says_what_anthropic_said(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.error("max_tokens: must be at most 8192", status=400))
    recorder = await run(fake_provider, AiRequest(message="hi"))
    error = recorder.terminal().error
    assert error.message == "API returned 400: max_tokens: must be at most 8192"
    assert (error.code, error.retryable) == ("provider.rejected", False)
    assert error.details["provider_code"] == "invalid_request_error"


async def test_cache_tokens_are_reported(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("ok", usage=(12, 3), cache_read_tokens=1000, cache_creation_tokens=200))
    recorder = await run(fake_provider, AiRequest(message="hi"))
    [usage] = kinds_of(recorder, "usage")
    # Anthropic's input_tokens leaves the cache out; the platform's input is all of it.
    assert (usage.input_tokens, usage.cached_input_tokens, usage.output_tokens) == (1212, 1000, 3)
    assert (usage.total_tokens, usage.model) == (1215, "fake-model")


async def test_cache_control_is_sent_when_the_hint_asks(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("ok"), Turn.text("ok"), Turn.text("ok"))
    ephemeral = {"type": "ephemeral"}
    base = AiRequest(message="hi", system_prompt="Be brief.")
    await run(fake_provider, base, tools=(WEATHER, TIME))
    conservative = AiRequest(
        message="hi", system_prompt="Be brief.", cache_hint=CacheHint(PromptCache.CONSERVATIVE, "k")
    )
    await run(fake_provider, conservative, tools=(WEATHER, TIME))
    aggressive = AiRequest(message="hi", system_prompt="Be brief.", cache_hint=CacheHint(PromptCache.AGGRESSIVE, "k"))
    await run(fake_provider, aggressive, tools=(WEATHER, TIME))
    plain, prefix, whole = fake_provider.requests

    assert "cache_control" not in json.dumps(plain.body)
    assert plain["system"] == "Be brief."
    assert prefix["system"] == [{"type": "text", "text": "Be brief.", "cache_control": ephemeral}]
    assert [t.get("cache_control") for t in prefix["tools"]] == [None, ephemeral]
    assert prefix["messages"] == [{"role": "user", "content": "hi"}]
    assert whole["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": ephemeral}]}
    ]


async def test_cache_control_is_never_sent_when_the_cache_key_is_disabled(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("ok"))
    config = ANTHROPIC_WIRE.config(fake_provider)
    runtime = AnthropicAgentRuntime(RuntimeConfig(prompt_cache_key="disabled", extra=config.extra))
    recorder = Recorder()
    hint = CacheHint(PromptCache.AGGRESSIVE, "k")
    try:
        await runtime.execute(context(recorder, AiRequest(message="hi", cache_hint=hint)), recorder.session)
    finally:
        await runtime.aclose()
    assert "cache_control" not in json.dumps(fake_provider.requests[0].body)


async def test_tool_results_go_back_as_tool_result_blocks(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(
            ToolCallScript("get_weather", {"city": "Oslo"}, call_id="toolu_w"),
            ToolCallScript("get_time", {"city": "Oslo"}, call_id="toolu_t"),
            text="Checking.",
        ),
        Turn.text("Cold and late."),
    )
    recorder = Recorder({"get_weather": "-5C", "get_time": "Error: no clock"})
    await run(fake_provider, AiRequest(message="Oslo?"), recorder, tools=(WEATHER, TIME))
    first, second = fake_provider.requests
    assert first["tools"][0] == {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "input_schema": WEATHER.parameters,
    }
    assert second["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_w", "name": "get_weather", "input": {"city": "Oslo"}},
            {"type": "tool_use", "id": "toolu_t", "name": "get_time", "input": {"city": "Oslo"}},
        ],
    }
    assert second["messages"][2] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_w", "content": "-5C"},
            {"type": "tool_result", "tool_use_id": "toolu_t", "content": "Error: no clock", "is_error": True},
        ],
    }
    assert [(c.call_id, c.name) for c in recorder.tool_calls] == [("toolu_w", "get_weather"), ("toolu_t", "get_time")]
    assert fake_provider.requests[1].last_tool_result == "Error: no clock"


async def test_history_alternates_and_system_turns_join_the_system_prompt(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("ok"))
    history = (
        ChatMessage("system", "Summary: the user likes tea."),
        ChatMessage("user", "Hello."),
        ChatMessage("user", "Are you there?"),
        ChatMessage("assistant", "Yes."),
    )
    await run(fake_provider, AiRequest(message="Tea?", system_prompt="Be kind.", history=history))
    [request] = fake_provider.requests
    assert request["system"] == "Be kind.\n\nSummary: the user likes tea."
    assert request["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Hello."}, {"type": "text", "text": "Are you there?"}]},
        {"role": "assistant", "content": "Yes."},
        {"role": "user", "content": "Tea?"},
    ]


async def test_the_answer_without_tools_keeps_them_declared_but_withheld(fake_provider: ScriptedModel) -> None:
    # Anthropic refuses a conversation holding `tool_use` blocks without the tools declared.
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "X"}, call_id="t1")),
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "Y"}, call_id="t2")),
        Turn.text("Best I can say."),
    )
    recorder = await run(
        fake_provider, AiRequest(message="?"), tools=(WEATHER,), tool_loop=ToolLoopPolicy.max_iterations(1)
    )
    assert recorder.terminal().WhichOneof("kind") == "complete"
    first, _, last = fake_provider.requests
    assert "tool_choice" not in first
    assert (last["tool_choice"], [t["name"] for t in last["tools"]]) == ({"type": "none"}, ["get_weather"])
    assert last.last_tool_result == "Error: the tool-call limit for this request was reached; answer with what you have"
    assert [c.call_id for c in recorder.tool_calls] == ["t1"]


async def test_settings_come_from_extra(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("ok"))
    extra = {
        "ANTHROPIC_BASE_URL": fake_provider.anthropic_base_url,
        "ANTHROPIC_API_KEY": "sk-test",
        "ANTHROPIC_MODEL": "claude-test",
        "ANTHROPIC_MAX_TOKENS": "321",
    }
    runtime = AnthropicAgentRuntime(RuntimeConfig(base_url="http://openai.invalid/v1", model="gpt-x", extra=extra))
    recorder = Recorder()
    try:
        await runtime.execute(context(recorder, AiRequest(message="hi")), recorder.session)
    finally:
        await runtime.aclose()
    [request] = fake_provider.requests
    assert (request["model"], request["max_tokens"]) == ("claude-test", 321)
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.headers["anthropic-version"]


async def test_a_base_url_alone_sends_no_credential(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("ok"))
    runtime = AnthropicAgentRuntime(RuntimeConfig(extra={"ANTHROPIC_BASE_URL": fake_provider.anthropic_base_url}))
    assert runtime.is_available()
    recorder = Recorder()
    try:
        await runtime.execute(context(recorder, AiRequest(message="hi", model="claude-x")), recorder.session)
    finally:
        await runtime.aclose()
    assert recorder.terminal().WhichOneof("kind") == "complete"
    [request] = fake_provider.requests
    assert "authorization" not in request.headers
    assert "x-api-key" not in request.headers
    assert request["model"] == "claude-x"  # the request's own model wins


def test_availability_and_defaults() -> None:
    assert not AnthropicAgentRuntime(RuntimeConfig(base_url="http://openai.example/v1", api_key="k")).is_available()
    assert AnthropicAgentRuntime(RuntimeConfig(extra={"ANTHROPIC_API_KEY": "k"})).is_available()
    assert not AnthropicAgentRuntime(RuntimeConfig(extra={"ANTHROPIC_BASE_URL": "ftp://x"})).is_available()
    runtime = AnthropicAgentRuntime(RuntimeConfig(extra={"ANTHROPIC_API_KEY": "k", "ANTHROPIC_MAX_TOKENS": "lots"}))
    assert (runtime.settings.max_tokens, runtime.settings.model) == (4096, "claude-sonnet-4-6")
    assert (AnthropicAgentRuntime.name, AnthropicAgentRuntime.priority) == ("anthropic", 100)
    assert not AnthropicAgentRuntime.hosts(object())


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
        tool_calls=(RecordedToolCall("toolu_r", "get_weather", '{"city": "Oslo"}'),), finish_reason="tool_use"
    )
    rounds = _Rounds(asked)
    recorder = await run(fake_provider, AiRequest(message="Oslo?"), tools=(WEATHER,), rounds=rounds)
    assert [c.call_id for c in recorder.tool_calls] == ["toolu_r"]
    assert len(fake_provider.requests) == 1  # the recorded round was not asked again
    assert fake_provider.requests[0].last_tool_result == "result of get_weather"
    [live] = rounds.committed
    assert (live.text, live.finish_reason) == ("It is cold.", "end_turn")
    assert recorder.text() == "It is cold."


async def test_a_provider_that_never_answers_fails_at_the_first_byte_deadline(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.silent(2.0))
    config = ANTHROPIC_WIRE.config(fake_provider)
    runtime = AnthropicAgentRuntime(RuntimeConfig(first_byte_timeout=0.2, extra=config.extra))
    recorder = Recorder()
    try:
        ctx = context(recorder, AiRequest(message="hi"), retry=RetryPolicy.NONE)
        await runtime.execute(ctx, recorder.session)
    finally:
        await runtime.aclose()
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
    fake_provider.script(Turn.text(""))
    recorder = await run(fake_provider, AiRequest(message="hi"))
    assert recorder.terminal().error.code == "provider.empty_answer"
