"""The scripted model answers alike in memory and on loopback HTTP: one script, one encoding, one pacing."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from atmosphere.sdk.errors import UserError
from atmosphere.testing import ModelRequest, ScriptedModel, ToolCallScript, Turn
from atmosphere.testing.model_server import main

WAYS = ("memory", "http")
STREAM = {"model": "m", "stream": True, "stream_options": {"include_usage": True}}


@contextlib.asynccontextmanager
async def reaching(model: ScriptedModel, way: str, *, read: float = 5.0) -> AsyncIterator[httpx.AsyncClient]:
    """A client of `model`, through the in-memory transport or over loopback HTTP."""
    timeout = httpx.Timeout(5.0, read=read)
    if way == "memory":
        transport = httpx.MockTransport(model.handle)
        async with httpx.AsyncClient(transport=transport, base_url="http://scripted.invalid/v1", timeout=timeout) as c:
            yield c
        return
    async with model.serving(), httpx.AsyncClient(base_url=model.base_url, timeout=timeout) as c:
        yield c


def ask(text: str = "hi", **extra: Any) -> dict[str, Any]:
    return {**STREAM, "messages": [{"role": "user", "content": text}], **extra}


async def read_all(client: httpx.AsyncClient) -> None:
    """Stream one answer to its end."""
    async with client.stream("POST", "chat/completions", json=ask()) as response:
        async for _ in response.aiter_lines():
            pass


def payloads(body: str) -> list[str]:
    return [line.removeprefix("data: ") for line in body.split("\n\n") if line.startswith("data: ")]


def text_of(body: str) -> str:
    chunks = [json.loads(p) for p in payloads(body) if p.startswith("{")]
    return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c.get("choices"))


SHAPES = [
    Turn.text("Hello brave world", usage=(12, 3)),
    Turn.tool_calls(ToolCallScript("get_weather", {"city": "Paris"}, call_id="c1"), text="Let me see."),
    Turn.tool_call("lookup", key="a"),
    Turn.truncated("cut short"),
    Turn.malformed("so far"),
    Turn.empty(),
    Turn.raw('{"choices": []}', "junk"),
    Turn.stream_error(message="model crashed", code="oops"),
    Turn.text("tiny", finish_reason="length", words=False),
]


@pytest.mark.parametrize("turn", SHAPES, ids=lambda t: f"{t.shape}-{t.content[:8]}")
async def test_every_shape_streams_the_same_bytes_both_ways(turn: Turn) -> None:
    bodies = []
    for way in WAYS:
        model = ScriptedModel(turn)
        async with reaching(model, way) as client:
            response = await client.post("chat/completions", json=ask())
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        bodies.append(response.text)
    assert bodies[0] == bodies[1]


@pytest.mark.parametrize("way", WAYS)
async def test_text_streams_word_by_word_with_usage_when_asked(way: str) -> None:
    model = ScriptedModel(Turn.text("Hello brave world"), Turn.text("ok", usage=None))
    async with reaching(model, way) as client:
        first = (await client.post("chat/completions", json=ask())).text
        second = (await client.post("chat/completions", json=ask())).text
    assert text_of(first) == "Hello brave world"
    assert len([p for p in payloads(first) if '"content": "' in p]) == 4  # the role chunk, then three words
    usages = [json.loads(p)["usage"] for p in payloads(first) if '"usage"' in p]
    assert usages == [{"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}]
    assert payloads(first)[-1] == "[DONE]"
    assert '"usage"' not in second


@pytest.mark.parametrize("way", WAYS)
async def test_a_request_past_the_script_is_one_400_naming_it(way: str) -> None:
    model = ScriptedModel("only one")
    async with reaching(model, way) as client:
        await client.post("chat/completions", json=ask())
        late = await client.post("chat/completions", json=ask())
        model.script("one more")
        again = await client.post("chat/completions", json=ask())
    assert late.status_code == 400
    message = late.json()["error"]["message"]
    assert message == "the scripted model has no turn left for request 2 (it answered 1 scripted turns)"
    assert text_of(again.text) == "one more"  # a turn scripted later is the next answered
    assert len(model.requests) == 3


@pytest.mark.parametrize("way", WAYS)
async def test_a_default_answers_once_the_script_is_used_up(way: str) -> None:
    model = ScriptedModel("first", default=Turn.text("again"))
    async with reaching(model, way) as client:
        texts = [text_of((await client.post("chat/completions", json=ask())).text) for _ in range(3)]
    assert texts == ["first", "again", "again"]


@pytest.mark.parametrize("way", WAYS)
async def test_requests_read_as_their_body(way: str) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    model = ScriptedModel("ok")
    async with reaching(model, way) as client:
        await client.post("chat/completions", json=ask("Paris?", tools=tools), headers={"Authorization": "Bearer k"})
    [request] = model.requests
    assert request["messages"] == [{"role": "user", "content": "Paris?"}]  # a list, as sent
    assert "tools" in request
    assert "response_format" not in request
    assert request.get("temperature") is None
    assert dict(request) == ask("Paris?", tools=tools)
    assert request == ask("Paris?", tools=tools)
    assert request.tools == ("get_weather",)
    assert request.messages[-1]["content"] == "Paris?"
    assert request.headers["authorization"] == "Bearer k"
    assert model.headers[0]["authorization"] == "Bearer k"


def test_a_model_request_is_a_read_only_mapping() -> None:
    body = {"messages": [{"role": "tool", "content": "sunny"}], "model": "m"}
    request = ModelRequest(messages=tuple(body["messages"]), tools=(), body=body)
    assert sorted(request) == ["messages", "model"]
    assert len(request) == 2
    assert request.last_tool_result == "sunny"
    with pytest.raises(TypeError):
        request["model"] = "other"  # type: ignore[index]


async def test_a_function_script_is_served_over_http_with_models_and_plain_completions() -> None:
    def answer(request: ModelRequest) -> Turn:
        asked = request["messages"][-1]["content"]
        if request.get("stream"):
            return Turn.text(f"streamed {asked}")
        return Turn.tool_calls(ToolCallScript("echo", {"said": asked}), text="calling", usage=(3, 4))

    model = ScriptedModel(function=answer, models=("a", "b"))
    async with reaching(model, "http") as client:
        listed = (await client.get("models")).json()
        streamed = (await client.post("chat/completions", json=ask("one"))).text
        plain = (await client.post("chat/completions", json={"messages": [{"role": "user", "content": "two"}]})).json()
        missing = await client.post("embeddings", json={})
    assert [m["id"] for m in listed["data"]] == ["a", "b"]
    assert text_of(streamed) == "streamed one"
    [choice] = plain["choices"]
    assert choice["message"]["content"] == "calling"
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "echo", "arguments": '{"said": "two"}'}
    assert choice["finish_reason"] == "tool_calls"
    assert plain["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert missing.status_code == 404
    assert len(model.requests) == 2


@pytest.mark.parametrize("way", WAYS)
async def test_a_script_function_that_raises_is_a_400_naming_it(way: str) -> None:
    def broken(_request: ModelRequest) -> Turn:
        raise KeyError("nope")

    async with reaching(ScriptedModel(function=broken), way) as client:
        response = await client.post("chat/completions", json=ask())
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "the script function raised KeyError: 'nope'"


@pytest.mark.parametrize("way", WAYS)
async def test_an_error_turn_has_its_status_body_and_retry_after(way: str) -> None:
    turn = Turn.error("slow down", status=429, retry_after=2, code="rate_limit", error_type="requests", param="p")
    async with reaching(ScriptedModel(turn), way) as client:
        response = await client.post("chat/completions", json=ask())
    assert response.status_code == 429
    assert response.headers["retry-after"] == "2"
    expected = {"message": "slow down", "type": "requests", "param": "p", "code": "rate_limit"}
    assert response.json() == {"error": expected}


def test_an_error_turn_needs_an_error_status_and_a_script_takes_turns_or_a_function() -> None:
    with pytest.raises(UserError, match="HTTP error status"):
        Turn.error("no", status=200)
    with pytest.raises(UserError, match="not both"):
        ScriptedModel("a", function=lambda _request: Turn.text("b"))
    with pytest.raises(UserError, match="takes no turns"):
        ScriptedModel(function=lambda _request: Turn.text("b")).script("a")


def test_usage_defaults_a_finished_answer_to_ten_and_five_and_a_broken_stream_to_none() -> None:
    finished = [Turn.text("a"), Turn.tool_call("t"), Turn.tool_calls(), Turn.stalled("a", seconds=1), Turn.silent(1)]
    assert {t.usage for t in finished} == {(10, 5)}
    broken = [Turn.truncated("a"), Turn.malformed(), Turn.empty(), Turn.raw(), Turn.error("x"), Turn.comments_only(1)]
    assert {t.usage for t in broken} == {None}


@pytest.mark.parametrize("way", WAYS)
async def test_chunk_delay_spaces_the_stream_out(way: str) -> None:
    model = ScriptedModel(Turn.text("one two three", chunk_delay=0.1))
    async with reaching(model, way) as client, client.stream("POST", "chat/completions", json=ask()) as response:
        arrivals = []
        async for line in response.aiter_lines():
            if '"content": "' in line and '"role"' not in line:
                arrivals.append(time.monotonic())
    assert len(arrivals) == 3
    assert min(b - a for a, b in itertools.pairwise(arrivals)) >= 0.08


@pytest.mark.parametrize("way", WAYS)
async def test_a_stall_longer_than_the_read_timeout_is_a_read_timeout_and_a_disconnect(way: str) -> None:
    model = ScriptedModel(Turn.stalled("Thinking", seconds=30))
    started = time.monotonic()
    async with reaching(model, way, read=0.3) as client:
        with pytest.raises(httpx.ReadTimeout):
            await read_all(client)
        await asyncio.wait_for(model.disconnected.wait(), 10.0)
    assert time.monotonic() - started < 20  # the stall lasts 30 s; loose for a loaded machine
    assert model.disconnects == 1


@pytest.mark.parametrize("way", WAYS)
async def test_silence_holds_the_headers_back(way: str) -> None:
    model = ScriptedModel(Turn.silent(0.3), Turn.silent(30))
    async with reaching(model, way, read=1.0) as client:
        started = time.monotonic()
        answered = await client.post("chat/completions", json=ask())
        waited = time.monotonic() - started
        with pytest.raises(httpx.ReadTimeout):
            await client.post("chat/completions", json=ask())
        await asyncio.wait_for(model.disconnected.wait(), 2.0)
    assert waited >= 0.3
    assert text_of(answered.text) == "ok"
    assert model.disconnects == 1


@pytest.mark.parametrize("way", WAYS)
async def test_a_client_that_stops_reading_is_a_disconnect_and_one_that_read_all_is_not(way: str) -> None:
    model = ScriptedModel(Turn.text("whole answer"), Turn.stalled("Thinking", seconds=30))
    async with reaching(model, way) as client:
        await client.post("chat/completions", json=ask())
        assert model.disconnects == 0
        async with client.stream("POST", "chat/completions", json=ask()) as response:
            async for line in response.aiter_lines():
                if "Thinking" in line:
                    break
        await asyncio.wait_for(model.disconnected.wait(), 2.0)
    assert model.disconnects == 1


@pytest.mark.parametrize("way", WAYS)
async def test_a_cancelled_reader_is_a_disconnect(way: str) -> None:
    model = ScriptedModel(Turn.comments_only(0.05))

    async with reaching(model, way) as client:
        task = asyncio.create_task(read_all(client))
        await asyncio.sleep(0.3)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.wait_for(model.disconnected.wait(), 2.0)
    assert model.disconnects == 1


def test_the_benchmarks_command_line_needs_a_port() -> None:
    with pytest.raises(SystemExit):
        main(["--tokens", "3"])


@pytest.mark.parametrize("way", WAYS)
async def test_a_body_that_is_not_a_json_object_is_a_400_and_no_request(way: str) -> None:
    model = ScriptedModel("unused")
    async with reaching(model, way) as client:
        broken = await client.post("chat/completions", content=b"{nope")
        listed = await client.post("chat/completions", json=[1, 2])
    assert (broken.status_code, listed.status_code) == (400, 400)
    assert listed.json()["error"]["message"] == "the request body is not a JSON object"
    assert model.requests == []
    assert len(model.turns) == 1
