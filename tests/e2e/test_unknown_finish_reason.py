"""An answer whose provider never said why it ended is not reported as finished, on any door.

The provider's stream closes properly (`[DONE]`) without a `finish_reason`: the answer may be whole
or cut short. The WebSocket's `complete` frame says `finishReason: "unknown"`; the OpenAI endpoint
says `finish_reason: null` (its schema allows null; a value its clients do not know would be no
truer), and the official client still reads the answer, whole and streamed.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
import websockets

from atmosphere.bus import NatsBus
from atmosphere.testing import ScriptedModel, Stack, Turn, run_stack

from .conftest import service_map
from .wsclient import read_run, ws_url

USER = [{"role": "user", "content": "Tell me everything"}]


def unexplained(text: str) -> Turn:
    """`text` in one chunk, then `[DONE]`: no chunk says why the answer ended."""
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    return Turn.raw(json.dumps({**chunk, "choices": [{"index": 0, "delta": {"content": text}}]}))


@pytest.fixture
async def stack(
    nats_url: str, bus_namespace: str, nats_bus: NatsBus, tmp_path: Path, fake_provider: ScriptedModel
) -> AsyncIterator[Stack]:
    services = service_map(
        nats_url,
        bus_namespace,
        tmp_path / "data",
        app="examples.assistant:app",
        llm_base_url=fake_provider.base_url,
        ingress={"ai_openai_enabled": True, "ai_openai_default_agent": "assistant"},
    )
    async with run_stack(services, bus=nats_bus) as running:
        yield running


async def test_an_unexplained_end_is_unknown_on_the_websocket_and_null_for_openai_clients(
    stack: Stack, fake_provider: ScriptedModel
) -> None:
    url = await stack.ingress_url()
    fake_provider.script(unexplained("Perhaps all of it."), unexplained("Whole?"), unexplained("Streamed?"))

    async with websockets.connect(ws_url(url, "assistant")) as ws:
        await ws.send("hi")
        frames = await read_run(ws)
    assert (frames[-1]["type"], frames[-1]["finishReason"]) == ("complete", "unknown")

    client = openai.AsyncOpenAI(base_url=f"{url}/atmosphere/v1", api_key="unused", max_retries=0)
    whole = await client.chat.completions.create(model="assistant", messages=USER)  # type: ignore[arg-type]
    assert (whole.choices[0].message.content, whole.choices[0].finish_reason) == ("Whole?", None)
    stream = await client.chat.completions.create(model="assistant", messages=USER, stream=True)  # type: ignore[arg-type]
    chunks = [c async for c in stream]
    await client.close()
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Streamed?"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] is None
