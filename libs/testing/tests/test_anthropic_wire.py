"""The scripted model on Anthropic's wire, read by Anthropic's own SDK (`anthropic.AsyncAnthropic`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import pytest

from atmosphere.testing import ScriptedModel, ToolCallScript, Turn

HI = [{"role": "user", "content": "hi"}]


@contextlib.asynccontextmanager
async def claude(model: ScriptedModel, *, max_retries: int = 0) -> AsyncIterator[anthropic.AsyncAnthropic]:
    """The model served on loopback, and an Anthropic client of it."""
    async with model.serving():
        client = anthropic.AsyncAnthropic(api_key="k", base_url=model.anthropic_base_url, max_retries=max_retries)
        try:
            yield client
        finally:
            await client.close()


async def events_of(client: anthropic.AsyncAnthropic, **params: Any) -> list[Any]:
    stream = await client.messages.create(model="m", max_tokens=64, messages=HI, stream=True, **params)
    async with stream:
        return [event async for event in stream]


async def test_a_text_answer_is_anthropics_event_sequence() -> None:
    model = ScriptedModel(Turn.text("Hello brave world", usage=(12, 3)))
    async with claude(model) as client:
        events = await events_of(client)
    assert [e.type for e in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]  # the `ping` after `message_start` is read and skipped by the SDK
    start, block, *deltas = events[:5]
    assert (start.message.model, start.message.usage.input_tokens, start.message.stop_reason) == ("m", 12, None)
    assert (block.index, block.content_block.type) == (0, "text")
    assert [d.delta.text for d in deltas] == ["Hello ", "brave ", "world"]
    assert (events[-2].delta.stop_reason, events[-2].usage.output_tokens) == ("end_turn", 3)


async def test_the_sdks_own_accumulator_reads_text_usage_and_cache_tokens() -> None:
    model = ScriptedModel(Turn.text("Cached.", usage=(5, 2), cache_read_tokens=900, cache_creation_tokens=40))
    async with claude(model) as client, client.messages.stream(model="m", max_tokens=64, messages=HI) as stream:
        pieces = [text async for text in stream.text_stream]
        message = await stream.get_final_message()
    assert "".join(pieces) == "Cached."
    assert (message.stop_reason, message.content[0].type) == ("end_turn", "text")
    usage = message.usage
    assert (usage.input_tokens, usage.output_tokens) == (5, 2)
    assert (usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (900, 40)


async def test_tool_use_input_streams_in_several_json_fragments() -> None:
    arguments = {"city": "San Francisco, California"}
    call = ToolCallScript("get_weather", arguments, call_id="toolu_1")
    model = ScriptedModel(Turn.tool_calls(call, text="Let me look."), Turn.tool_calls(call))
    async with claude(model) as client:
        events = await events_of(client)
        async with client.messages.stream(model="m", max_tokens=64, messages=HI) as stream:
            message = await stream.get_final_message()
    fragments = [
        e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert len(fragments) > 1
    starts = [e.content_block for e in events if e.type == "content_block_start"]
    assert [(b.type, getattr(b, "id", None)) for b in starts] == [("text", None), ("tool_use", "toolu_1")]
    assert {e.index for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"} == {1}
    [tool_use] = message.content
    assert (tool_use.type, tool_use.id, tool_use.name, tool_use.input) == (
        "tool_use",
        "toolu_1",
        "get_weather",
        arguments,
    )
    assert message.stop_reason == "tool_use"


@pytest.mark.parametrize(
    ("finish", "stop_reason"),
    [("length", "max_tokens"), ("content_filter", "refusal"), ("stop", "end_turn"), ("pause_turn", "pause_turn")],
)
async def test_finish_reasons_are_spelled_in_anthropics_words(finish: str, stop_reason: str) -> None:
    model = ScriptedModel(Turn.text("cut", finish_reason=finish), Turn.text("cut", finish_reason=finish))
    async with claude(model) as client:
        events = await events_of(client)
        message = await client.messages.create(model="m", max_tokens=64, messages=HI)
    assert events[-2].delta.stop_reason == stop_reason
    assert message.stop_reason == stop_reason


async def test_a_stop_sequence_stop_names_the_sequence() -> None:
    model = ScriptedModel(Turn.text("up to", finish_reason="stop_sequence"))
    async with claude(model) as client:
        events = await events_of(client, stop_sequences=["END"])
    assert (events[-2].delta.stop_reason, events[-2].delta.stop_sequence) == ("stop_sequence", "END")


async def test_a_request_that_does_not_stream_gets_one_message() -> None:
    call = ToolCallScript("lookup", {"key": "a"}, call_id="toolu_9")
    model = ScriptedModel(Turn.tool_calls(call, text="Looking.", usage=(7, 4)))
    async with claude(model) as client:
        message = await client.messages.create(model="m", max_tokens=64, messages=HI)
    assert [b.type for b in message.content] == ["text", "tool_use"]
    assert (message.content[0].text, message.content[1].input) == ("Looking.", {"key": "a"})
    assert (message.stop_reason, message.usage.input_tokens, message.usage.output_tokens) == ("tool_use", 7, 4)
    assert model.requests[0].body.get("stream") is None


@pytest.mark.parametrize(
    ("status", "error", "kind"),
    [
        (429, anthropic.RateLimitError, "rate_limit_error"),
        (529, anthropic.OverloadedError, "overloaded_error"),
        (400, anthropic.BadRequestError, "invalid_request_error"),
        (500, anthropic.InternalServerError, "api_error"),
    ],
)
async def test_errors_are_anthropics_shape_status_and_retry_after(
    status: int, error: type[anthropic.APIStatusError], kind: str
) -> None:
    model = ScriptedModel(Turn.error("scripted failure", status=status, retry_after=2, code="scripted_code"))
    async with claude(model) as client:
        with pytest.raises(error) as raised:
            await client.messages.create(model="m", max_tokens=64, messages=HI, stream=True)
    exc = raised.value
    assert (exc.status_code, exc.type, exc.api_message, exc.error_code) == (
        status,
        kind,
        "scripted failure",
        "scripted_code",
    )
    assert exc.response.headers["retry-after"] == "2"
    assert exc.body == {
        "type": "error",
        "error": {"type": kind, "message": "scripted failure", "details": {"error_code": "scripted_code"}},
        "request_id": "req_fake",
    }


async def test_the_sdk_retries_an_overload_honoring_retry_after() -> None:
    model = ScriptedModel(Turn.error("Overloaded", status=529, retry_after=0.05), Turn.text("Back."))
    async with claude(model, max_retries=1) as client:
        message = await client.messages.create(model="m", max_tokens=64, messages=HI)
    assert message.content[0].text == "Back."
    assert len(model.requests) == 2


async def test_an_error_event_mid_stream_is_raised_by_the_sdk() -> None:
    model = ScriptedModel(Turn.stream_error(message="Overloaded", error_type="overloaded_error"))
    async with claude(model) as client:
        with pytest.raises(anthropic.APIStatusError) as raised:
            await events_of(client)
    assert (raised.value.type, raised.value.api_message) == ("overloaded_error", "Overloaded")


async def test_a_truncated_stream_ends_without_its_stop() -> None:
    model = ScriptedModel(Turn.truncated("half an"))
    async with claude(model) as client:
        events = await events_of(client)
    assert [e.type for e in events][-1] == "content_block_stop"


async def test_a_request_past_the_script_is_an_invalid_request() -> None:
    model = ScriptedModel()
    async with claude(model) as client:
        with pytest.raises(anthropic.BadRequestError) as raised:
            await client.messages.create(model="m", max_tokens=64, messages=HI)
    assert (
        raised.value.api_message == "the scripted model has no turn left for request 1 (it answered 0 scripted turns)"
    )


async def test_the_models_are_listed_in_anthropics_shape() -> None:
    model = ScriptedModel(models=("claude-a", "claude-b"))
    async with claude(model) as client:
        models = [m async for m in client.models.list()]
    assert [(m.id, m.type) for m in models] == [("claude-a", "model"), ("claude-b", "model")]


async def test_the_request_is_kept_as_anthropic_sent_it() -> None:
    model = ScriptedModel(Turn.text("ok"))
    tools = [{"name": "get_weather", "description": "Weather.", "input_schema": {"type": "object"}}]
    conversation = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]},
    ]
    async with claude(model) as client:
        await client.messages.create(model="m", max_tokens=64, system="Be brief.", tools=tools, messages=conversation)
    [request] = model.requests
    assert (request["system"], request["max_tokens"], request.tools) == ("Be brief.", 64, ("get_weather",))
    assert list(request.messages) == conversation
    assert request.last_tool_result == "sunny"
    assert request.headers["anthropic-version"]


async def test_a_client_that_hangs_up_mid_stream_is_a_disconnect() -> None:
    model = ScriptedModel(Turn.stalled("Thinking", seconds=30))
    async with claude(model) as client:
        stream = await client.messages.create(model="m", max_tokens=64, messages=HI, stream=True)
        async with stream:
            async for event in stream:
                if event.type == "content_block_delta":
                    break
        await asyncio.wait_for(model.disconnected.wait(), 2.0)
    assert model.disconnects == 1


async def test_models_route_by_wire_and_both_ways_answer_alike() -> None:
    turn = Turn.tool_calls(ToolCallScript("get_weather", {"city": "Paris"}, call_id="t1"), text="Let me see.")
    bodies = []
    for way in ("memory", "http"):
        model = ScriptedModel(turn)
        async with contextlib.AsyncExitStack() as stack:
            if way == "memory":
                client = httpx.AsyncClient(
                    transport=httpx.MockTransport(model.handle), base_url="http://scripted.invalid"
                )
            else:
                await stack.enter_async_context(model.serving())
                client = httpx.AsyncClient(base_url=model.anthropic_base_url)
            await stack.enter_async_context(client)
            body = {"model": "m", "max_tokens": 8, "messages": HI, "stream": True}
            bodies.append((await client.post("/v1/messages", json=body)).text)
            openai = (await client.get("/v1/models")).json()
            claude_list = (await client.get("/v1/models", headers={"anthropic-version": "2023-06-01"})).json()
        assert openai["object"] == "list"
        assert claude_list["data"][0]["type"] == "model"
        assert claude_list["has_more"] is False
    assert bodies[0] == bodies[1]
    assert bodies[0].startswith("event: message_start\ndata: ")
    assert "event: ping\n" in bodies[0]
    assert bodies[0].endswith('event: message_stop\ndata: {"type": "message_stop"}\n\n')
