"""The scripted model on Cohere's v2 wire, read by Cohere's own SDK (`cohere.AsyncClientV2`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import cohere
import httpx
import pytest

from atmosphere.testing import ScriptedModel, ToolCallScript, Turn

HI = [{"role": "user", "content": "hi"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


@contextlib.asynccontextmanager
async def command(model: ScriptedModel, *, in_memory: bool = False) -> AsyncIterator[cohere.AsyncClientV2]:
    """A Cohere client of the model: served on loopback, or through the in-memory transport."""
    async with contextlib.AsyncExitStack() as stack:
        if in_memory:
            http = httpx.AsyncClient(transport=httpx.MockTransport(model.handle))
            base_url = "http://scripted.invalid"
        else:
            await stack.enter_async_context(model.serving())
            http, base_url = httpx.AsyncClient(), model.root_url
        await stack.enter_async_context(http)
        yield cohere.AsyncClientV2(
            api_key="k", base_url=base_url, httpx_client=http, max_retries=0, log_warning_experimental_features=False
        )


async def events_of(client: cohere.AsyncClientV2, **params: Any) -> list[Any]:
    """The events of a streamed chat (its messages `HI` unless given)."""
    return [event async for event in client.chat_stream(**{"model": "m", "messages": HI, **params})]


async def chat(client: cohere.AsyncClientV2, **params: Any) -> Any:
    """A chat that does not stream (its messages `HI` unless given)."""
    return await client.chat(**{"model": "m", "messages": HI, **params})


@pytest.mark.parametrize("in_memory", [False, True])
async def test_a_text_answer_is_cohere_s_event_sequence(in_memory: bool, caplog: pytest.LogCaptureFixture) -> None:
    model = ScriptedModel(Turn.text("Hello brave world", usage=(12, 3)))
    with caplog.at_level(logging.WARNING):
        async with command(model, in_memory=in_memory) as client:
            events = await events_of(client)
    assert not caplog.records, "the SDK skipped a frame it could not read"
    assert [e.type for e in events] == [
        "message-start",
        "content-start",
        "content-delta",
        "content-delta",
        "content-delta",
        "content-end",
        "message-end",
    ]
    start, block, *deltas = events[:5]
    assert (start.id, start.delta.message.role) == ("msg_fake", "assistant")
    assert (block.index, block.delta.message.content.type) == (0, "text")
    assert [d.delta.message.content.text for d in deltas] == ["Hello ", "brave ", "world"]
    end = events[-1].delta
    assert end.finish_reason == "COMPLETE"
    assert (end.usage.tokens.input_tokens, end.usage.tokens.output_tokens) == (12, 3)
    assert (end.usage.billed_units.input_tokens, end.usage.billed_units.output_tokens) == (12, 3)


async def test_tool_calls_stream_their_plan_then_argument_fragments(caplog: pytest.LogCaptureFixture) -> None:
    arguments = {"city": "San Francisco, California"}
    turn = Turn.tool_calls(
        ToolCallScript("get_weather", arguments, call_id="get_weather_1"),
        ToolCallScript("get_time", {"city": "SF"}),
        text="I will look.",
    )
    model = ScriptedModel(turn)
    with caplog.at_level(logging.WARNING):
        async with command(model) as client:
            events = await events_of(client, tools=[WEATHER])
    assert not caplog.records
    kinds = [e.type for e in events]
    assert kinds[:5] == ["message-start", "tool-plan-delta", "tool-plan-delta", "tool-plan-delta", "tool-call-start"]
    assert "content-start" not in kinds
    assert "".join(e.delta.message.tool_plan for e in events if e.type == "tool-plan-delta") == "I will look."
    starts = [e for e in events if e.type == "tool-call-start"]
    assert [(e.index, e.delta.message.tool_calls.id, e.delta.message.tool_calls.function.name) for e in starts] == [
        (0, "get_weather_1", "get_weather"),
        (1, "get_time_1", "get_time"),
    ]
    fragments = [
        e.delta.message.tool_calls.function.arguments for e in events if e.type == "tool-call-delta" and e.index == 0
    ]
    assert len(fragments) > 1
    assert "".join(fragments) == '{"city": "San Francisco, California"}'
    assert [e.index for e in events if e.type == "tool-call-end"] == [0, 1]
    assert events[-1].delta.finish_reason == "TOOL_CALL"


@pytest.mark.parametrize(
    ("finish", "cohere_finish"),
    [
        ("stop", "COMPLETE"),
        ("length", "MAX_TOKENS"),
        ("tool_calls", "TOOL_CALL"),
        ("STOP_SEQUENCE", "STOP_SEQUENCE"),
        # Cohere has no finish reason for a content filter: the word goes as it is.
        ("content_filter", "content_filter"),
    ],
)
async def test_finish_reasons_are_spelled_in_cohere_s_words(finish: str, cohere_finish: str) -> None:
    model = ScriptedModel(Turn.text("cut", finish_reason=finish), Turn.text("cut", finish_reason=finish))
    async with command(model) as client:
        events = await events_of(client)
        response = await chat(client)
    assert events[-1].delta.finish_reason == cohere_finish
    assert response.finish_reason == cohere_finish


async def test_a_request_that_does_not_stream_gets_one_chat_response() -> None:
    call = ToolCallScript("lookup", {"key": "a"}, call_id="lookup_9")
    model = ScriptedModel(Turn.tool_calls(call, text="Looking.", usage=(7, 4)), Turn.text("Done.", usage=(3, 1)))
    async with command(model) as client:
        calling = await chat(client, tools=[WEATHER])
        answering = await chat(client)
    assert (calling.finish_reason, calling.message.tool_plan) == ("TOOL_CALL", "Looking.")
    [tool_call] = calling.message.tool_calls or []
    assert (tool_call.id, tool_call.function.name, tool_call.function.arguments) == (
        "lookup_9",
        "lookup",
        '{"key": "a"}',
    )
    assert (calling.usage.tokens.input_tokens, calling.usage.tokens.output_tokens) == (7, 4)
    assert (answering.finish_reason, answering.message.content[0].text) == ("COMPLETE", "Done.")
    assert model.requests[0].body.get("stream") is False


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (429, cohere.TooManyRequestsError),
        (400, cohere.BadRequestError),
        (401, cohere.UnauthorizedError),
        (500, cohere.InternalServerError),
        (503, cohere.ServiceUnavailableError),
    ],
)
async def test_errors_are_cohere_s_shape_status_and_retry_after(status: int, error: type[Exception]) -> None:
    model = ScriptedModel(Turn.error("scripted failure", status=status, retry_after=2))
    async with command(model) as client:
        with pytest.raises(error) as raised:
            await events_of(client)
    exc = raised.value
    assert isinstance(exc, cohere.core.ApiError)
    assert (exc.status_code, exc.body) == (status, {"id": "req_fake", "message": "scripted failure"})
    assert (exc.headers or {})["retry-after"] == "2"


async def test_a_generation_that_fails_mid_stream_ends_with_error() -> None:
    model = ScriptedModel(Turn.stream_error(message="internal failure"))
    async with command(model) as client:
        events = await events_of(client)
    assert [e.type for e in events] == ["message-start", "message-end"]
    assert (events[-1].delta.finish_reason, events[-1].delta.error) == ("ERROR", "internal failure")


async def test_a_truncated_stream_ends_without_its_message_end() -> None:
    model = ScriptedModel(Turn.truncated("half an"))
    async with command(model) as client:
        events = await events_of(client)
    assert [e.type for e in events][-1] == "content-end"


async def test_an_empty_stream_ends_without_a_finish_reason() -> None:
    model = ScriptedModel(Turn.empty())
    async with command(model) as client:
        events = await events_of(client)
    assert [e.type for e in events] == ["message-start", "message-end"]
    assert events[-1].delta.finish_reason is None


async def test_a_request_past_the_script_is_a_bad_request() -> None:
    model = ScriptedModel()
    async with command(model) as client:
        with pytest.raises(cohere.BadRequestError) as raised:
            await chat(client)
    assert raised.value.body == {
        "id": "req_fake",
        "message": "the scripted model has no turn left for request 1 (it answered 0 scripted turns)",
    }


async def test_the_models_are_listed_in_cohere_s_shape() -> None:
    model = ScriptedModel(models=("command-a", "command-r7b"))
    async with command(model) as client:
        page = await client.models.list(endpoint="chat")
    assert [(m.name, m.endpoints) for m in page.models] == [("command-a", ["chat"]), ("command-r7b", ["chat"])]
    assert page.next_page_token is None


async def test_the_request_is_kept_as_cohere_sent_it() -> None:
    model = ScriptedModel(Turn.text("ok"))
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "tool_plan": "I will check.",
            "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "sunny"},
    ]
    async with command(model) as client:
        await events_of(client, messages=conversation, tools=[WEATHER], max_tokens=64)
    [request] = model.requests
    assert (request["max_tokens"], request["stream"], request.tools) == (64, True, ("get_weather",))
    assert list(request.messages) == conversation
    assert request.last_tool_result == "sunny"
    assert request.headers["x-fern-sdk-name"] == "cohere"


async def test_a_client_that_hangs_up_mid_stream_is_a_disconnect() -> None:
    model = ScriptedModel(Turn.stalled("Thinking", seconds=30))
    async with command(model) as client:
        params: dict[str, Any] = {"model": "m", "messages": HI}
        stream = client.chat_stream(**params)
        async for event in stream:
            if event.type == "content-delta":
                break
        await stream.aclose()  # type: ignore[attr-defined]  # an async generator, typed as an iterator
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
                client = httpx.AsyncClient(base_url=model.root_url)
            await stack.enter_async_context(client)
            body = {"model": "m", "messages": HI, "stream": True}
            bodies.append((await client.post("/v2/chat", json=body)).text)
            openai = (await client.get("/v1/models")).json()
            cohere_list = (await client.get("/v1/models", headers={"x-fern-sdk-name": "cohere"})).json()
        assert openai["object"] == "list"
        assert cohere_list["models"][0]["name"] == "fake-model"
    assert bodies[0] == bodies[1]
    assert bodies[0].startswith('event: message-start\ndata: {"type": "message-start", ')
    assert "event: tool-plan-delta\n" in bodies[0]
    assert bodies[0].endswith("\n\n")
