"""The OpenAI endpoint never leaves a client hanging, and a retry never starts a second run.

With the official `openai` client (its own retries on) and plain httpx, against the six services'
real `serve()` on a real nats-server: an approval-gated tool is a clear 422 at once and its run
ends; a client that leaves, before the first byte or mid-stream, cancels its run (the model
provider sees its request closed); an SDK's retry and a repeated `Idempotency-Key` attach to the
first attempt's run (the provider is asked once).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from atmosphere.bus import NatsBus
from atmosphere.bus.runs import stored_events
from atmosphere.config import TokenGrant
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.ingress.settings import IngressOptions
from atmosphere.testing import ScriptedModel, Stack, ToolCallScript, Turn, run_stack, wait_until

from .conftest import service_map

ADA = "token-ada-everything"
BOB = "token-bob-everything"
GRACE = 30.0
"""The retry grace of these tests: longer than any test waits, so only a retry or its end decides."""

DELETE = Turn.tool_calls(ToolCallScript("delete_note", {"title": "groceries"}), text="Checking first.")


@pytest.fixture
async def stack(
    nats_url: str, bus_namespace: str, nats_bus: NatsBus, tmp_path: Path, fake_provider: ScriptedModel
) -> AsyncIterator[Stack]:
    services = service_map(
        nats_url,
        bus_namespace,
        tmp_path / "data",
        app="examples.approvals:app",
        llm_base_url=fake_provider.base_url,
        ingress={
            "ai_openai_enabled": True,
            "ai_openai_retry_grace": GRACE,
            "ingress": IngressOptions(
                port=0, auth_tokens=(TokenGrant(token=ADA, user_id="ada"), TokenGrant(token=BOB, user_id="bob"))
            ),
        },
    )
    async with run_stack(services, bus=nats_bus) as running:
        yield running


def client(url: str, token: str = ADA, **options: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/atmosphere/v1", api_key=token, **options)


async def complete(openai_client: openai.AsyncOpenAI, body: dict[str, Any], run_ids: list[str]) -> None:
    """Ask, and read a streamed answer to its end; the run's id (from its head) into `run_ids`."""
    answer = await openai_client.chat.completions.create(**body)
    if body.get("stream"):
        run_ids.append(answer.response.headers["x-atmosphere-run-id"])  # type: ignore[union-attr]
        async for _ in answer:  # type: ignore[union-attr]
            pass


async def terminal_of(bus: NatsBus, run_id: str) -> RunEvent | None:
    events = await stored_events(bus, run_id)
    return next((e for e in events.values() if e.WhichOneof("kind") in {"complete", "error"}), None)


def hung_up(provider: ScriptedModel) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return provider.disconnects >= 1

    return check


def asked(provider: ScriptedModel) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return len(provider.requests) >= 1

    return check


def ask(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "notes", "messages": [{"role": "user", "content": content}], **extra}


async def test_an_approval_gated_tool_is_a_clear_error_at_once_and_its_run_ends(
    stack: Stack, fake_provider: ScriptedModel, nats_bus: NatsBus
) -> None:
    url = await stack.ingress_url()
    runs: list[str] = []
    for stream in (False, True):
        fake_provider.script(DELETE)
        before = len(fake_provider.requests)
        started = time.monotonic()
        # The client's own retries are on (2 by default): a 422 must not be retried. A stream
        # whose head went out before the approval was asked (the model said something first)
        # ends with the same error as its last chunk.
        async with client(url) as sdk:
            with pytest.raises(openai.APIError) as refused:
                await complete(sdk, ask("delete groceries", stream=stream), runs)
        took = time.monotonic() - started
        print(f"approval refused in {took * 1000:.0f} ms (stream={stream})")
        assert took < 10, took  # not the 300 s an approval waits; typically well under a second
        error = refused.value.body
        assert isinstance(error, dict)
        assert error["code"] == "approval_required"
        assert "'delete_note'" in error["message"]
        assert "/atmosphere/agent/notes" in error["message"]  # a door that can carry one
        assert len(fake_provider.requests) == before + 1  # one run, asked once: no retry, no duplicate
        if isinstance(refused.value, openai.APIStatusError):
            assert refused.value.status_code == 422
            runs.append(refused.value.response.headers["x-atmosphere-run-id"])
    assert len(runs) == 2

    # No run is left waiting: each ended, cancelled, and the tool never ran.
    async def ended() -> bool:
        return all([await terminal_of(nats_bus, run_id) is not None for run_id in runs])

    await wait_until(ended, timeout=10, what="the approval-gated runs to end")
    for run_id in runs:
        kinds = [e.WhichOneof("kind") for e in (await stored_events(nats_bus, run_id)).values()]
        assert "approval_required" in kinds
        assert "tool_result" not in kinds
        terminal = await terminal_of(nats_bus, run_id)
        assert terminal is not None
        assert terminal.error.code == "run.cancelled"


async def test_a_client_that_leaves_mid_stream_cancels_the_run(stack: Stack, fake_provider: ScriptedModel) -> None:
    url = await stack.ingress_url()
    fake_provider.script(Turn.stalled("Let me think about that", seconds=60))
    async with client(url, max_retries=0) as sdk:
        stream = await sdk.chat.completions.create(**ask("think", stream=True))
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        await stream.close()
    # The run is cancelled: dispatch stops its model call, and the provider sees it hang up.
    await wait_until(hung_up(fake_provider), timeout=10, what="the provider to see the request closed")


async def test_a_client_that_leaves_before_the_first_byte_cancels_the_run(
    stack: Stack, fake_provider: ScriptedModel
) -> None:
    url = await stack.ingress_url()
    fake_provider.script(Turn.silent(60))
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {ADA}"}) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.post("/atmosphere/v1/chat/completions", json=ask("hello"), timeout=httpx.Timeout(10, read=1))
    # A plain client (nothing says it retries) is not waited for: its run is cancelled at once.
    await wait_until(hung_up(fake_provider), timeout=10, what="the provider to see the request closed")


async def test_the_sdks_retry_attaches_to_the_first_attempts_run(stack: Stack, fake_provider: ScriptedModel) -> None:
    url = await stack.ingress_url()
    # The model answers after 4 s; the client gives up on each attempt after 1 s and retries.
    fake_provider.script(Turn.silent(4))
    before = len(fake_provider.requests)
    async with client(url, timeout=1.0, max_retries=6) as sdk:
        answer = await sdk.chat.completions.create(**ask("slow question"))
    assert answer.choices[0].message.content == "ok"
    assert len(fake_provider.requests) == before + 1  # every retry followed the one run
    assert fake_provider.disconnects == 0  # and it was never cancelled


async def test_an_sdk_retry_header_alone_attaches_only_a_retry(stack: Stack, fake_provider: ScriptedModel) -> None:
    url = await stack.ingress_url()
    fake_provider.script(Turn.silent(3), Turn.text("second"))
    headers = {"Authorization": f"Bearer {ADA}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
        first = asyncio.create_task(
            http.post("/atmosphere/v1/chat/completions", json=ask("same"), headers={"x-stainless-retry-count": "0"})
        )
        await wait_until(asked(fake_provider), timeout=10, what="the first attempt's model call")
        first.cancel()  # the client gave up on it (its connection closes)
        retry = await http.post(
            "/atmosphere/v1/chat/completions", json=ask("same"), headers={"x-stainless-retry-count": "1"}
        )
        assert retry.status_code == 200, retry.text
        assert retry.json()["choices"][0]["message"]["content"] == "ok"
        assert len(fake_provider.requests) == 1
        # A first attempt of the same request is a new completion (two identical asks are two).
        again = await http.post(
            "/atmosphere/v1/chat/completions", json=ask("same"), headers={"x-stainless-retry-count": "0"}
        )
        assert again.json()["choices"][0]["message"]["content"] == "second"
        assert len(fake_provider.requests) == 2


async def test_an_idempotency_key_is_one_completion_per_user(stack: Stack, fake_provider: ScriptedModel) -> None:
    url = await stack.ingress_url()
    fake_provider.script(Turn.text("Only once."), Turn.text("Bob's own."))
    key = {"Idempotency-Key": "order-42"}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        ada = {"Authorization": f"Bearer {ADA}", **key}
        first = await http.post("/atmosphere/v1/chat/completions", json=ask("once"), headers=ada)
        again = await http.post("/atmosphere/v1/chat/completions", json=ask("once"), headers=ada)
        assert first.status_code == again.status_code == 200
        assert first.json() == again.json()  # the same completion: id, text and all
        assert first.json()["choices"][0]["message"]["content"] == "Only once."
        # Streamed this time: still the same run, replayed.
        streamed = await http.post("/atmosphere/v1/chat/completions", json=ask("once", stream=True), headers=ada)
        assert streamed.status_code == 422  # another body (stream: true) under the same key
        assert streamed.json()["error"]["code"] == "idempotency_key_reused"
        # Another user's same key is their own completion, never Ada's answer.
        bob = await http.post(
            "/atmosphere/v1/chat/completions", json=ask("once"), headers={"Authorization": f"Bearer {BOB}", **key}
        )
        assert bob.json()["choices"][0]["message"]["content"] == "Bob's own."
        assert len(fake_provider.requests) == 2
        bad = await http.post(
            "/atmosphere/v1/chat/completions", json=ask("once"), headers={**ada, "Idempotency-Key": "x" * 256}
        )
        assert bad.status_code == 400
        assert "Idempotency-Key" in json.dumps(bad.json())


async def test_a_retry_after_a_retryable_error_is_a_new_run(stack: Stack, fake_provider: ScriptedModel) -> None:
    # The first attempt was answered (a 503 saying "try again"): its retry, by key or by the SDK's
    # marker, runs again instead of replaying that refusal.
    url = await stack.ingress_url()
    # Past dispatch's own retry window (20 s by default): dispatch gives up at once and says so.
    fake_provider.script(Turn.error("overloaded", status=503, retry_after=60), Turn.text("Back again."))
    key = {"Authorization": f"Bearer {ADA}", "Idempotency-Key": "after-an-outage"}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        first = await http.post("/atmosphere/v1/chat/completions", json=ask("outage"), headers=key)
        assert first.status_code == 503
        again = await http.post("/atmosphere/v1/chat/completions", json=ask("outage"), headers=key)
        assert again.status_code == 200, again.text
        assert again.json()["choices"][0]["message"]["content"] == "Back again."
        # And now the key stands for the run that answered: a third try replays it.
        third = await http.post("/atmosphere/v1/chat/completions", json=ask("outage"), headers=key)
        assert third.json() == again.json()
    assert len(fake_provider.requests) == 2
