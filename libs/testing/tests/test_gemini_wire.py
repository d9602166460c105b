"""The scripted model on the Gemini API's wire, read by Google's own client (`google.genai.Client`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import errors, types

from atmosphere.testing import ScriptedModel, ToolCallScript, Turn, gemini_wire


@contextlib.asynccontextmanager
async def gemini(model: ScriptedModel) -> AsyncIterator[genai.Client]:
    """The model served on loopback, and a `google-genai` client of it (no retries; httpx, not aiohttp)."""
    async with model.serving(), httpx.AsyncClient() as http:
        options = types.HttpOptions(base_url=model.root_url, httpx_async_client=http)
        yield genai.Client(api_key="k", http_options=options)


async def chunks_of(client: genai.Client, **config: Any) -> list[types.GenerateContentResponse]:
    stream = await client.aio.models.generate_content_stream(
        model="gemini-test", contents="hi", config=types.GenerateContentConfig(**config) if config else None
    )
    return [chunk async for chunk in stream]


async def test_text_streams_in_chunks_and_the_last_has_the_finish_and_usage() -> None:
    model = ScriptedModel(Turn.text("Hello brave world", usage=(12, 3)))
    async with gemini(model) as client:
        chunks = await chunks_of(client)
    assert [c.text for c in chunks[:-1]] == ["Hello ", "brave ", "world"]
    assert {c.model_version for c in chunks} == {"gemini-test"}
    last = chunks[-1]
    assert last.candidates is not None
    assert last.candidates[0].finish_reason == types.FinishReason.STOP
    usage = last.usage_metadata
    assert usage is not None
    assert (usage.prompt_token_count, usage.candidates_token_count, usage.total_token_count) == (12, 3, 15)
    # Earlier chunks repeat the prompt count only, as Gemini's do: adding chunks up would be wrong.
    assert chunks[0].usage_metadata is not None
    assert chunks[0].usage_metadata.candidates_token_count is None
    request = model.requests[0]
    assert request.messages == ({"parts": [{"text": "hi"}], "role": "user"},)
    assert model.headers[0]["x-goog-api-key"] == "k"


async def test_function_calls_arrive_whole_with_their_ids() -> None:
    calls = (ToolCallScript("get_weather", {"city": "Paris"}, call_id="c1"), ToolCallScript("get_time", {}))
    model = ScriptedModel(Turn.tool_calls(*calls, text="Let me look."))
    async with gemini(model) as client:
        chunks = await chunks_of(client)
    assert "".join(c.text or "" for c in chunks[:-1]) == "Let me look."
    function_calls = chunks[-1].function_calls or []
    assert [(f.id, f.name, f.args) for f in function_calls] == [
        ("c1", "get_weather", {"city": "Paris"}),
        (None, "get_time", {}),
    ]


async def test_a_call_that_does_not_stream_gets_one_response() -> None:
    model = ScriptedModel(Turn.tool_calls(ToolCallScript("lookup", {"key": "a"}), text="Looking.", usage=(7, 4)))
    async with gemini(model) as client:
        declared = types.Tool(function_declarations=[types.FunctionDeclaration(name="lookup", description="Look.")])
        response = await client.aio.models.generate_content(
            model="gemini-test", contents="hi", config=types.GenerateContentConfig(tools=[declared])
        )
    assert response.text == "Looking."
    assert [(f.name, f.args) for f in response.function_calls or []] == [("lookup", {"key": "a"})]
    assert response.usage_metadata is not None
    assert response.usage_metadata.total_token_count == 11
    assert model.requests[0].tools == ("lookup",)


@pytest.mark.parametrize(
    ("finish", "gemini_reason"),
    [("length", types.FinishReason.MAX_TOKENS), ("content_filter", types.FinishReason.SAFETY)],
)
async def test_finish_reasons_are_spelled_in_geminis_words(finish: str, gemini_reason: types.FinishReason) -> None:
    model = ScriptedModel(Turn.text("cut", finish_reason=finish))
    async with gemini(model) as client:
        chunks = await chunks_of(client)
    assert chunks[-1].candidates is not None
    assert chunks[-1].candidates[0].finish_reason == gemini_reason


@pytest.mark.parametrize(
    ("status", "name", "error_type"),
    [(429, "RESOURCE_EXHAUSTED", errors.ClientError), (503, "UNAVAILABLE", errors.ServerError)],
)
async def test_errors_are_googles_shape_with_their_status_names(
    status: int, name: str, error_type: type[errors.APIError]
) -> None:
    model = ScriptedModel(Turn.error("slow down", status=status, retry_after=2))
    async with gemini(model) as client:
        with pytest.raises(error_type) as raised:
            await chunks_of(client)
    error = raised.value
    assert (error.code, error.status, error.message) == (status, name, "slow down")
    assert error.details["error"]["details"] == [{"@type": gemini_wire.RETRY_INFO, "retryDelay": "2s"}]
    assert error.response is not None
    assert error.response.headers["retry-after"] == "2"


async def test_an_error_mid_stream_is_raised_by_the_client() -> None:
    model = ScriptedModel(Turn.stream_error(message="backend overloaded"))
    async with gemini(model) as client:
        with pytest.raises(errors.ServerError, match="backend overloaded"):
            await chunks_of(client)


async def test_the_models_are_listed() -> None:
    model = ScriptedModel(models=("gemini-a", "gemini-b"))
    async with gemini(model) as client:
        names = [m.name async for m in await client.aio.models.list()]
    assert names == ["models/gemini-a", "models/gemini-b"]


def test_the_route_says_whether_a_call_streams() -> None:
    assert gemini_wire.is_call("POST", "/v1beta/models/gemini-x:streamGenerateContent")
    assert gemini_wire.is_stream("/v1beta/models/gemini-x:streamGenerateContent")
    assert gemini_wire.is_call("POST", "/v1beta/models/gemini-x:generateContent")
    assert not gemini_wire.is_stream("/v1beta/models/gemini-x:generateContent")
    assert gemini_wire.model_of("/v1beta/models/gemini-x:generateContent") == "gemini-x"
    assert not gemini_wire.claims("POST", "/v1/chat/completions", {"authorization": "Bearer k"})
