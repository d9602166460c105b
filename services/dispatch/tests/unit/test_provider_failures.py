"""The built-in runtime under provider failures beyond the contract suite."""

import asyncio
import json
import logging
import time

import pytest

from atmosphere.dispatch.runtime.http11 import Http11Transport
from atmosphere.dispatch.runtime.openai import BuiltInAgentRuntime
from atmosphere.dispatch.runtime.provider import retry_after_seconds
from atmosphere.dispatch.runtime.sse import sse_data
from atmosphere.dispatch.runtime_config import generation_options, runtime_config
from atmosphere.dispatch.settings import LlmSettings
from atmosphere.sdk import AiRequest, RetryPolicy
from atmosphere.sdk.runtime import RuntimeConfig
from atmosphere.testing import ScriptedModel, Turn
from atmosphere.testing.runtime_contract import Recorder, context


async def run(
    provider: ScriptedModel,
    *,
    stall: float = 5.0,
    retry: RetryPolicy | None = None,
    config: RuntimeConfig | None = None,
) -> Recorder:
    recorder = Recorder()
    runtime = BuiltInAgentRuntime(config or RuntimeConfig(base_url=provider.base_url, model="m", stall_timeout=stall))
    overrides = {"retry": retry} if retry else {}
    try:
        await runtime.execute(context(recorder, AiRequest(message="hi"), **overrides), recorder.session)
    finally:
        await runtime.aclose()
    return recorder


async def test_a_stream_cut_mid_answer_is_an_error_not_a_complete(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.truncated("Half an ans"))
    recorder = await run(fake_provider)
    assert recorder.text() == "Half an ans"
    assert recorder.terminal().error.message == "the provider stream ended before the answer was complete"
    assert "complete" not in recorder.kinds()


async def test_a_malformed_chunk_is_an_error(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.malformed("Hello"))
    recorder = await run(fake_provider)
    assert recorder.terminal().error.code == "provider.malformed"
    assert "malformed chunk" in recorder.terminal().error.message


async def test_a_stall_after_text_is_an_error(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.stalled("Thinking", seconds=10))
    started = time.monotonic()
    recorder = await run(fake_provider, stall=0.5)
    assert time.monotonic() - started < 8  # the stall lasts 10 s: cut at 0.5 s, loose for a loaded machine
    assert recorder.terminal().error.message == "provider stalled: no data for 0.5 s"


async def test_a_stall_before_any_text_is_retried(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.stalled("", seconds=10), Turn.text("Recovered."))
    recorder = await run(fake_provider, stall=0.5, retry=RetryPolicy(max_retries=1, initial_delay=0.01))
    assert recorder.text() == "Recovered."
    assert recorder.terminal().WhichOneof("kind") == "complete"


async def test_retries_are_bounded_and_say_so(fake_provider: ScriptedModel) -> None:
    fake_provider.script(*[Turn.error("overloaded", status=503) for _ in range(3)])
    recorder = await run(fake_provider, retry=RetryPolicy(max_retries=2, initial_delay=0.01))
    assert recorder.terminal().error.message == "Failed after 3 attempts: API returned 503: overloaded"
    assert len(fake_provider.requests) == 3


async def test_an_unreachable_provider_is_retried_then_reported() -> None:
    recorder = Recorder()
    runtime = BuiltInAgentRuntime(RuntimeConfig(base_url="http://127.0.0.1:9/v1", connect_timeout=0.5))
    try:
        await runtime.execute(
            context(recorder, AiRequest(message="hi"), retry=RetryPolicy(max_retries=1, initial_delay=0.01)),
            recorder.session,
        )
    finally:
        await runtime.aclose()
    assert recorder.terminal().error.message.startswith("Failed after 2 attempts: provider connection failed")


async def test_generation_knobs_reach_the_request(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("ok"))
    llm = LlmSettings(
        base_url=fake_provider.base_url,
        api_key="sk-test",
        model="gpt-x",
        temperature="0.2",
        max_tokens="64",
        top_p="0.9",
        stop="END, ,STOP",
    )
    await run(fake_provider, config=runtime_config(llm, max_concurrency=4))
    body = fake_provider.requests[0]
    assert (body["model"], body["temperature"], body["max_tokens"], body["top_p"], body["stop"]) == (
        "gpt-x",
        0.2,
        64,
        0.9,
        ["END", "STOP"],
    )
    assert body["stream_options"] == {"include_usage": True}
    assert fake_provider.headers[0]["authorization"] == "Bearer sk-test"


def test_knobs_are_clamped_and_malformed_ones_ignored() -> None:
    options = generation_options(LlmSettings(temperature="7", top_p="-1", max_tokens="0", stop=""))
    assert (options.temperature, options.top_p, options.max_tokens, options.stop) == (2.0, 0.0, None, ())
    options = generation_options(LlmSettings(temperature="warm", max_tokens="1.5", top_p=""))
    assert (options.temperature, options.max_tokens, options.top_p) == (None, None, None)
    assert generation_options(LlmSettings()).temperature is None  # unset knobs leave the body alone


def test_knobs_are_numbers_once_read_and_malformed_ones_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="atmosphere.dispatch"):
        llm = LlmSettings(temperature="warm", max_tokens="1.5", top_p="3")
    assert (llm.temperature, llm.max_tokens, llm.top_p) == (None, None, 1.0)
    assert "ignoring LLM_TEMPERATURE='warm': not a number" in caplog.text
    assert "ignoring LLM_MAX_TOKENS='1.5': not a positive integer" in caplog.text
    assert "clamping LLM_TOP_P=3.0 to [0.0, 1.0]" in caplog.text
    assert LlmSettings(temperature="0.5", max_tokens=" 64 ", stop=" A ,B").model_dump(
        include={"temperature", "max_tokens", "stop"}
    ) == {"temperature": 0.5, "max_tokens": 64, "stop": ("A", "B")}


def test_knobs_read_from_the_environment_are_sanitized_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_TEMPERATURE", "hot")
    monkeypatch.setenv("LLM_MAX_TOKENS", "-3")
    monkeypatch.setenv("LLM_STOP", "END, ,STOP")
    monkeypatch.setenv("LLM_TOOL_OUTPUT_OFFLOAD_THRESHOLD", "many")
    llm = LlmSettings()
    assert (llm.temperature, llm.max_tokens, llm.stop, llm.tool_output_offload_threshold) == (
        None,
        None,
        ("END", "STOP"),
        8000,
    )


async def test_unset_knobs_are_not_sent(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("ok"))
    await run(fake_provider)
    assert not {"temperature", "max_tokens", "top_p", "stop"} & set(fake_provider.requests[0])


def test_retry_after_accepts_seconds_and_dates() -> None:
    assert retry_after_seconds("2") == 2.0
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("soon") is None
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past


def test_the_connection_pool_matches_the_configured_concurrency() -> None:
    runtime = BuiltInAgentRuntime(RuntimeConfig(base_url="http://x/v1", max_concurrency=48))
    transport = runtime.client._transport  # type: ignore[attr-defined]
    assert isinstance(transport, Http11Transport)
    assert transport.max_connections == 48
    asyncio.run(runtime.aclose())


async def test_sse_framing() -> None:
    async def lines():  # type: ignore[no-untyped-def]
        for line in [": keep-alive", "event: message", 'data: {"a":', "data: 1}", "", "data: [DONE]"]:
            yield line

    # Comments and other fields are skipped; the data lines of one event join with a newline.
    collected = [d async for d in sse_data(lines())]
    assert collected == ['{"a":\n1}', "[DONE]"]
    assert json.loads(collected[0]) == {"a": 1}
