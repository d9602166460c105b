"""A misbehaving model provider, as clients meet it: honest terminals, bounded waits, errors that keep their meaning.

The official `openai` client retries 408/409/429/5xx by default: a provider 400 must reach it
as a 400 (one run, one provider call), an outage as a 503 with `Retry-After`, a provider that
answered nonsense as a 502 it is told not to retry.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import websockets

from atmosphere.bus import NatsBus
from atmosphere.testing import ScriptedModel, Stack, Turn, run_stack

from .conftest import service_map
from .test_ingress_transports import parse_sse
from .wsclient import read_run, ws_url

SETTINGS = {"ai_openai_enabled": True, "ai_openai_default_agent": "assistant"}
USER = [{"role": "user", "content": "Tell me everything"}]
# Fast but real deadlines: no answer within 0.5 s is a timeout; retries start only in the first 2 s.
LLM = {"first_byte_timeout": 0.5, "retry_window": 2.0}


@pytest.fixture
async def stack(
    nats_url: str, bus_namespace: str, nats_bus: NatsBus, tmp_path: Path, fake_provider: ScriptedModel
) -> AsyncIterator[Stack]:
    services = service_map(
        nats_url,
        bus_namespace,
        tmp_path / "data",
        ("governance", "memory", "tape", "sandbox", "dispatch", "ingress"),
        app="examples.assistant:app",
        llm_base_url=fake_provider.base_url,
        ingress=SETTINGS,
        llm=LLM,
    )
    async with run_stack(services, bus=nats_bus) as running:
        yield running


async def client_for(stack: Stack, *, max_retries: int = 2) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{await stack.ingress_url()}/atmosphere/v1", api_key="unused", max_retries=max_retries
    )


async def test_a_provider_400_is_a_400_with_its_code_and_runs_once(stack: Stack, fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.error(
            "This model's maximum context length is 8192 tokens.",
            status=400,
            code="context_length_exceeded",
            error_type="invalid_request_error",
            param="messages",
        )
    )
    client = await client_for(stack)  # the default: up to 2 retries of anything retryable
    with pytest.raises(openai.BadRequestError) as raised:
        await client.chat.completions.create(model="assistant", messages=USER)  # type: ignore[arg-type]
    await client.close()
    assert raised.value.code == "context_length_exceeded"
    assert raised.value.param == "messages"
    assert "maximum context length" in raised.value.message
    assert len(fake_provider.requests) == 1  # neither dispatch nor the client multiplied the run


async def test_a_provider_outage_is_a_503_with_retry_after_that_the_client_honours(
    stack: Stack, fake_provider: ScriptedModel
) -> None:
    # The provider says to come back in 3 s, past dispatch's 2 s retry window: dispatch gives up
    # at once and the client hears the same advice; its one retry then succeeds.
    fake_provider.script(Turn.error("overloaded", status=503, retry_after=3))
    client = await client_for(stack, max_retries=0)
    with pytest.raises(openai.APIStatusError) as raised:
        await client.chat.completions.create(model="assistant", messages=USER)  # type: ignore[arg-type]
    assert raised.value.status_code == 503
    assert raised.value.response.headers["retry-after"] == "3"
    assert "overloaded" in raised.value.message
    assert len(fake_provider.requests) == 1

    fake_provider.script(Turn.error("overloaded", status=503, retry_after=3), Turn.text("Back again."))
    retrying = await client_for(stack, max_retries=1)
    answer = await retrying.chat.completions.create(model="assistant", messages=USER)  # type: ignore[arg-type]
    assert answer.choices[0].message.content == "Back again."
    assert len(fake_provider.requests) == 3
    await asyncio.gather(client.close(), retrying.close())


async def test_a_silent_provider_fails_fast_with_a_progress_frame(stack: Stack, fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.silent(60), Turn.silent(60))
    async with websockets.connect(ws_url(await stack.ingress_url(), "assistant")) as ws:
        await ws.send("hello?")
        frames = await read_run(ws, timeout=30)
    progress = [f["data"] for f in frames if f["type"] == "progress"]
    assert len(progress) == 1
    assert progress[0].startswith("Model provider did not answer (timeout); retrying in ")
    assert progress[0].endswith("(attempt 2 of 4)")
    error = frames[-1]
    assert (error["type"], error["code"], error["recoverable"]) == ("error", "provider.timeout", True)
    assert error["data"] == "Failed after 2 attempts: the model provider did not answer within 0.5 s"
    assert len(fake_provider.requests) == 2  # the retry window closed: no third attempt


async def test_a_silent_provider_is_a_503_over_openai(stack: Stack, fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.silent(60), Turn.silent(60))
    client = await client_for(stack, max_retries=0)
    with pytest.raises(openai.APIStatusError) as raised:
        await client.chat.completions.create(model="assistant", messages=USER)  # type: ignore[arg-type]
    await client.close()
    assert raised.value.status_code == 503
    assert "did not answer within 0.5 s" in raised.value.message
    assert raised.value.response.headers["retry-after"] == "5"


async def test_an_empty_answer_is_a_502_the_client_does_not_retry(stack: Stack, fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.empty(), Turn.text("should not be asked"))
    client = await client_for(stack)
    with pytest.raises(openai.APIStatusError) as raised:
        await client.chat.completions.create(model="assistant", messages=USER)  # type: ignore[arg-type]
    await client.close()
    assert raised.value.status_code == 502
    assert raised.value.response.headers["x-should-retry"] == "false"
    assert "empty answer" in raised.value.message
    assert len(fake_provider.requests) == 1


@pytest.mark.parametrize("reason", ["length", "content_filter"])
async def test_a_cut_off_answer_says_so_on_every_transport(
    stack: Stack, fake_provider: ScriptedModel, reason: str
) -> None:
    url = await stack.ingress_url()
    text = "Once upon a time"
    fake_provider.script(*[Turn.text(text, finish_reason=reason) for _ in range(4)])
    client = await client_for(stack, max_retries=0)
    whole = await client.chat.completions.create(model="assistant", messages=USER)  # type: ignore[arg-type]
    assert (whole.choices[0].message.content, whole.choices[0].finish_reason) == (text, reason)
    stream = await client.chat.completions.create(model="assistant", messages=USER, stream=True)  # type: ignore[arg-type]
    chunks = [c async for c in stream]
    await client.close()
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == reason

    async with websockets.connect(ws_url(url, "assistant")) as ws:
        await ws.send("again")
        frames = await read_run(ws)
    assert (frames[-1]["type"], frames[-1]["finishReason"]) == ("complete", reason)

    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        response = await http.post("/atmosphere/agent/assistant", content="and again")
    sse: list[tuple[int, dict[str, Any]]] = parse_sse(response.text)
    assert (sse[-1][1]["type"], sse[-1][1]["finishReason"]) == ("complete", reason)


async def test_a_finished_answer_says_stop(stack: Stack, fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("Done."))
    async with websockets.connect(ws_url(await stack.ingress_url(), "assistant")) as ws:
        await ws.send("hi")
        frames = await read_run(ws)
    assert (frames[-1]["type"], frames[-1]["finishReason"]) == ("complete", "stop")
