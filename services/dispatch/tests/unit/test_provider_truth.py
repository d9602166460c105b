"""Terminals that tell the truth, provider deadlines and the error details ingress maps to HTTP."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from atmosphere.bus.errors import (
    ProviderEmptyAnswerError,
    ProviderError,
    ProviderMalformedError,
    ProviderRateLimitedError,
    ProviderRejectedError,
    ProviderUnavailableError,
    ServiceError,
)
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.dispatch.runtime.openai import BuiltInAgentRuntime
from atmosphere.dispatch.runtime.provider import provider_fault
from atmosphere.dispatch.runtime_config import runtime_config
from atmosphere.dispatch.settings import LlmSettings
from atmosphere.sdk import AiRequest, RetryPolicy
from atmosphere.sdk.runtime import RuntimeConfig
from atmosphere.testing import ScriptedModel, ToolCallScript, Turn
from atmosphere.testing.runtime_contract import WEATHER, Recorder, context

QUICK = RetryPolicy(max_retries=2, initial_delay=0.05, max_delay=0.05)


async def run(provider: ScriptedModel, *, retry: RetryPolicy = QUICK, **limits: Any) -> Recorder:
    recorder = Recorder()
    config = RuntimeConfig(base_url=provider.base_url, model="m", **{"stall_timeout": 5.0, **limits})
    runtime = BuiltInAgentRuntime(config)
    try:
        await runtime.execute(
            context(recorder, AiRequest(message="hi"), retry=retry, tools=(WEATHER,)), recorder.session
        )
    finally:
        await runtime.aclose()
    return recorder


def progress(recorder: Recorder) -> list[str]:
    return [e.progress.message for e in recorder.events if e.WhichOneof("kind") == "progress"]


def error_of(recorder: Recorder) -> RunEvent:
    terminal = recorder.terminal()
    assert terminal.WhichOneof("kind") == "error", recorder.kinds()
    return terminal


@pytest.mark.parametrize("reason", ["length", "content_filter"])
async def test_a_cut_off_answer_completes_with_its_finish_reason(fake_provider: ScriptedModel, reason: str) -> None:
    fake_provider.script(Turn.text("The answer was cut", finish_reason=reason))
    recorder = await run(fake_provider)
    assert recorder.text() == "The answer was cut"
    assert recorder.terminal().complete.finish_reason == reason


async def test_a_finished_answer_says_stop(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("All done."))
    recorder = await run(fake_provider)
    assert recorder.terminal().complete.finish_reason == "stop"


async def test_a_cut_off_tool_call_is_never_run(fake_provider: ScriptedModel) -> None:
    # The token limit hit mid-arguments: running the tool with half its JSON would be a lie too.
    fake_provider.script(
        Turn(
            calls=(ToolCallScript("get_weather", '{"city": "Par'),),
            content="Let me look",
            chunks=("Let me look",),
            finish_reason="length",
            usage=None,
        )
    )
    recorder = await run(fake_provider)
    assert recorder.tool_calls == []
    assert recorder.terminal().complete.finish_reason == "length"
    assert len(fake_provider.requests) == 1


async def test_an_unknown_finish_reason_of_a_whole_answer_is_stop(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("Fine.", finish_reason="end_turn"))
    recorder = await run(fake_provider)
    assert recorder.terminal().complete.finish_reason == "stop"


async def test_an_answer_whose_provider_never_said_why_it_ended_completes_as_unknown(
    fake_provider: ScriptedModel,
) -> None:
    # The stream closes properly (`[DONE]`) but no chunk carries a `finish_reason`: the answer
    # may be whole or cut short, and the terminal must not vouch for either.
    fake_provider.script(Turn.raw(_chunk({"content": "Maybe all "}), _chunk({"content": "of it."})))
    recorder = await run(fake_provider)
    assert recorder.text() == "Maybe all of it."
    assert recorder.terminal().complete.finish_reason == "unknown"


async def test_a_stream_cut_before_its_end_is_still_an_error(fake_provider: ScriptedModel) -> None:
    # Neither `finish_reason` nor `[DONE]`: the stream broke off, which is no answer at all.
    fake_provider.script(Turn.truncated("Half an ans"))
    recorder = await run(fake_provider, retry=RetryPolicy(max_retries=0))
    assert error_of(recorder).error.message == "the provider stream ended before the answer was complete"


@pytest.mark.parametrize(
    "reply",
    [Turn.empty(), Turn.text(""), Turn.text("", finish_reason="stop")],
    ids=["only-done", "no-text", "stop-without-text"],
)
async def test_an_answer_without_content_is_an_error(fake_provider: ScriptedModel, reply: Turn) -> None:
    fake_provider.script(reply)
    recorder = await run(fake_provider)
    error = error_of(recorder).error
    assert error.code == "provider.empty_answer"
    assert "empty answer" in error.message
    assert "complete" not in recorder.kinds()


async def test_a_provider_400_keeps_its_status_and_code(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.error(
            "This model's maximum context length is 4096 tokens.",
            status=400,
            code="context_length_exceeded",
            error_type="invalid_request_error",
            param="messages",
        )
    )
    error = error_of(await run(fake_provider)).error
    assert error.code == "provider.rejected"
    assert not error.retryable
    assert dict(error.details) == {
        "status": "400",
        "provider_code": "context_length_exceeded",
        "provider_param": "messages",
    }
    assert error.message == "API returned 400: This model's maximum context length is 4096 tokens."
    assert len(fake_provider.requests) == 1


async def test_a_context_overflow_reported_mid_stream_is_a_rejection(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.stream_error(message="Requested tokens exceed context window", code="context_length_exceeded")
    )
    error = error_of(await run(fake_provider)).error
    assert error.code == "provider.rejected"
    assert error.details["status"] == "400"
    assert error.details["provider_code"] == "context_length_exceeded"
    assert "connection" not in error.message


async def test_a_provider_500_is_retried_then_retryable(fake_provider: ScriptedModel) -> None:
    fake_provider.script(*[Turn.error("boom", status=500) for _ in range(3)])
    recorder = await run(fake_provider)
    error = error_of(recorder).error
    assert (error.code, error.retryable, error.details["status"]) == ("provider.unavailable", True, "500")
    assert error.message == "Failed after 3 attempts: API returned 500: boom"
    assert progress(recorder) == [
        "Model provider failed (500); retrying in 0.1 s (attempt 2 of 3)",
        "Model provider failed (500); retrying in 0.1 s (attempt 3 of 3)",
    ]


async def test_a_rate_limit_far_beyond_the_retry_window_gives_up_at_once(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.error("slow down", status=429, retry_after=3600))
    recorder = await run(fake_provider, retry=RetryPolicy(max_retries=3, max_delay=3600))
    error = error_of(recorder).error
    assert error.code == "provider.rate_limited"
    assert error.details["retry_after"] == "3600"
    assert progress(recorder) == []
    assert len(fake_provider.requests) == 1


async def test_out_of_quota_is_not_a_rate_limit(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.error("You exceeded your current quota", status=429, code="insufficient_quota"))
    error = error_of(await run(fake_provider)).error
    assert (error.code, error.retryable, error.details["status"]) == ("provider.rejected", False, "429")
    assert len(fake_provider.requests) == 1


async def test_a_silent_provider_is_retried_with_progress_then_fails(fake_provider: ScriptedModel) -> None:
    fake_provider.script(*[Turn.silent(30) for _ in range(3)])
    recorder = await run(fake_provider, first_byte_timeout=0.3)
    error = error_of(recorder).error
    assert (error.code, error.retryable) == ("provider.timeout", True)
    assert error.message == "Failed after 3 attempts: the model provider did not answer within 0.3 s"
    assert progress(recorder) == [
        "Model provider did not answer (timeout); retrying in 0.1 s (attempt 2 of 3)",
        "Model provider did not answer (timeout); retrying in 0.1 s (attempt 3 of 3)",
    ]
    assert len(fake_provider.requests) == 3
    await fake_provider.disconnected.wait()  # every attempt hung up on the provider


async def test_headers_without_an_answer_do_not_count_as_answering(fake_provider: ScriptedModel) -> None:
    # Comments are bytes: they satisfy the first-byte deadline, and the whole-call deadline cuts them.
    fake_provider.script(Turn.comments_only(every=0.1))
    recorder = await run(fake_provider, call_timeout=1.0)
    error = error_of(recorder).error
    assert (error.code, error.message) == ("provider.timeout", "the model call exceeded its 1 s deadline")
    assert len(fake_provider.requests) == 1


async def test_no_retry_starts_after_the_retry_window(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.silent(30), Turn.text("never"))
    recorder = await run(fake_provider, first_byte_timeout=0.2, retry_window=0.1)
    assert error_of(recorder).error.message == "the model provider did not answer within 0.2 s"
    assert progress(recorder) == []
    assert len(fake_provider.requests) == 1


async def test_a_provider_that_answers_after_a_retry_completes(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.silent(30), Turn.text("Here now."))
    recorder = await run(fake_provider, first_byte_timeout=0.3)
    assert recorder.text() == "Here now."
    assert recorder.terminal().complete.finish_reason == "stop"
    assert progress(recorder) == ["Model provider did not answer (timeout); retrying in 0.1 s (attempt 2 of 3)"]


def _chunk(delta: Any = None, **fields: Any) -> str:
    return json.dumps({"choices": [{"index": 0, "delta": delta if delta is not None else {}, **fields}], **{}})


HOSTILE_CHUNKS: dict[str, tuple[str, str]] = {
    # name: (raw `data:` payload, the error code it must end in)
    "deep-nesting": ("[" * 100_000 + "]" * 100_000, "provider.malformed"),
    "huge-integer": ('{"usage": {"prompt_tokens": ' + "9" * 5000 + "}}", "provider.malformed"),
    "not-an-object": ("[1, 2, 3]", "provider.malformed"),
    "not-json": ("{oops", "provider.malformed"),
    "tool-index-out-of-range": (
        _chunk({"tool_calls": [{"index": 10**9, "function": {"name": "x"}}]}),
        "provider.malformed",
    ),
    "negative-tool-index": (_chunk({"tool_calls": [{"index": -1}]}), "provider.malformed"),
    "error-object": ('{"error": {"message": "exploded", "type": "server_error"}}', "provider.error"),
}


@pytest.mark.parametrize("name", list(HOSTILE_CHUNKS))
async def test_a_hostile_chunk_is_an_error_never_a_crash(fake_provider: ScriptedModel, name: str) -> None:
    raw, code = HOSTILE_CHUNKS[name]
    fake_provider.script(Turn.raw(raw))
    recorder = await run(fake_provider)
    assert error_of(recorder).error.code == code


async def test_odd_but_harmless_chunks_are_tolerated(fake_provider: ScriptedModel) -> None:
    lone_surrogate = '"Hi \\ud800 there"'
    raws = (
        json.dumps({"choices": "not a list"}),
        json.dumps({"choices": [{"delta": ["not", "a", "dict"]}]}),
        json.dumps({"choices": [{"delta": {"tool_calls": "nope"}}]}),
        '{"choices": [{"index": 0, "delta": {"content": ' + lone_surrogate + "}}]}",
        json.dumps({"usage": {"prompt_tokens": -5, "completion_tokens": 1e300, "total_tokens": True}}),
        json.dumps({"choices": [{"delta": {}, "finish_reason": "stop"}]}),
    )
    fake_provider.script(Turn.raw(*raws))
    recorder = await run(fake_provider)
    assert recorder.text() == "Hi ? there"  # the lone surrogate cannot travel in protobuf
    [usage] = [e.usage for e in recorder.events if e.WhichOneof("kind") == "usage"]
    assert (usage.input_tokens, usage.output_tokens) == (0, 1 << 53)
    assert recorder.terminal().complete.finish_reason == "stop"
    recorder.terminal().SerializeToString()


def test_provider_faults_are_bounded_and_tolerant() -> None:
    assert provider_fault(b'{"error": {"message": "bad", "code": 400, "type": "x y"}}').code == "400"
    assert provider_fault(b'{"error": {"message": "bad", "code": "a b", "type": "x y"}}').type == ""
    assert provider_fault(b"[" * 50_000).message.startswith("[[[")
    assert len(provider_fault(b'{"error": "' + b"x" * 10_000 + b'"}').message) == 500
    assert provider_fault(b'{"error": {"message": "\\ud800"}}').message == "?"
    assert provider_fault(b"").message == "no details"


def test_the_deadline_settings_reach_the_runtime() -> None:
    llm = LlmSettings(base_url="http://x/v1", first_byte_timeout=3, call_timeout=60, retry_window=7)
    config = runtime_config(llm, max_concurrency=1)
    assert (config.first_byte_timeout, config.call_timeout, config.retry_window) == (3, 60, 7)
    defaults = LlmSettings()
    # A provider that never answers fails within the retry window plus one first-byte wait.
    assert defaults.retry_window + defaults.first_byte_timeout <= 30
    assert defaults.connect_timeout <= defaults.first_byte_timeout


def _answering(status: int, body: str, headers: dict[str, str] | None = None) -> httpx.MockTransport:
    def answer(_request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers=headers or {"content-type": "text/event-stream"}, content=body.encode())

    return httpx.MockTransport(answer)


@pytest.mark.parametrize(
    ("transport", "kind"),
    [
        (_answering(400, '{"error": {"message": "no"}}'), ProviderRejectedError),
        (_answering(429, '{"error": {"message": "later"}}', {"retry-after": "3600"}), ProviderRateLimitedError),
        (_answering(503, "overloaded"), ProviderUnavailableError),
        (_answering(200, "data: not json\n\n"), ProviderMalformedError),
        (_answering(200, "data: [DONE]\n\n"), ProviderEmptyAnswerError),
        (_answering(200, 'data: {"error": {"message": "boom"}}\n\n'), ProviderError),
    ],
    ids=["rejected", "rate-limited", "unavailable", "malformed", "empty", "mid-stream"],
)
async def test_each_provider_failure_reads_back_as_its_catalogue_class(
    transport: httpx.MockTransport, kind: type[ProviderError]
) -> None:
    recorder = Recorder()
    runtime = BuiltInAgentRuntime(RuntimeConfig(base_url="http://model.test/v1", model="m"), transport=transport)
    try:
        await runtime.execute(context(recorder, AiRequest(message="hi"), retry=RetryPolicy.NONE), recorder.session)
    finally:
        await runtime.aclose()
    error = ServiceError.from_proto(error_of(recorder).error)
    assert type(error) is kind
