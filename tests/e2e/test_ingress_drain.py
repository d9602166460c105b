"""A real ingress process on SIGTERM: every open stream learns where to resume, and it exits in its grace.

Four clients wait on runs held by an approval (the quiet spell a proxy would cut): an SSE
stream, a WebSocket, an OpenAI stream and a long-poll. Quiet SSE streams get keep-alive
comments; SIGTERM closes the WebSocket with 1012 naming its run, ends the SSE stream with an
event naming the run and its last seq, ends the OpenAI stream with a retryable error, answers
the long-poll, and the process exits 0 well within its grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from atmosphere.bus import BusError, NatsBus
from atmosphere.testing import ScriptedModel, Stack, ToolCallScript, Turn, run_stack, wait_until

from .conftest import ROOT, service_map

GRACE = 8
KEEP_ALIVE = 0.2
WAITING = Turn.tool_calls(ToolCallScript("delete_note", {"title": "groceries"}), text="Checking first.")


@pytest.fixture
async def backend(
    nats_url: str, bus_namespace: str, nats_bus: NatsBus, tmp_path: Path, fake_provider: ScriptedModel
) -> AsyncIterator[Stack]:
    """Every service but ingress, in this process: ingress runs as a process of its own."""
    names = ("governance", "memory", "tape", "sandbox", "dispatch")
    services = service_map(
        nats_url,
        bus_namespace,
        tmp_path / "data",
        names,
        app="examples.approvals:app",
        llm_base_url=fake_provider.base_url,
    )
    async with run_stack(services, bus=nats_bus) as running:
        yield running


@contextlib.asynccontextmanager
async def ingress_process(nats_url: str, namespace: str, tmp_path: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("ATMOSPHERE_", "LLM_"))},
        "ATMOSPHERE_NATS__URL": nats_url,
        "ATMOSPHERE_NATS__NAMESPACE": namespace,
        "ATMOSPHERE_DATA_DIR": str(tmp_path / "ingress"),
        "ATMOSPHERE_INGRESS__PORT": "0",
        "ATMOSPHERE_INGRESS__SSE_KEEP_ALIVE": str(KEEP_ALIVE),
        "ATMOSPHERE_INGRESS__DRAIN_GRACE": str(GRACE),
        "ATMOSPHERE_AI_OPENAI_ENABLED": "true",
    }
    log = (tmp_path / "ingress.log").open("wb")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "atmosphere.ingress", env=env, cwd=ROOT, stdout=log, stderr=log
    )
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        log.close()


@dataclass
class Lines:
    """What a streaming client has read so far, line by line."""

    lines: list[str] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def read(self, response: httpx.Response) -> None:
        async for line in response.aiter_lines():
            self.lines.append(line)
            self.changed.set()

    async def until(self, found: Callable[[list[str]], bool], timeout: float = 30) -> None:
        async with asyncio.timeout(timeout):
            while not found(self.lines):
                self.changed.clear()
                await self.changed.wait()

    def data(self) -> list[Any]:
        return [json.loads(line[6:]) for line in self.lines if line.startswith("data: {")]


async def closing(ws: websockets.ClientConnection) -> websockets.ConnectionClosed:
    """How the server closed `ws` (frames before the close are skipped)."""
    while True:
        try:
            await asyncio.wait_for(ws.recv(), 30)
        except websockets.ConnectionClosed as closed:
            return closed


def keep_alive_after_approval(lines: list[str]) -> bool:
    asked = next((i for i, line in enumerate(lines) if '"approval-required"' in line), None)
    return asked is not None and ": keep-alive" in lines[asked:]


async def test_sigterm_drains_every_stream_and_exits_within_the_grace(
    backend: Stack, fake_provider: ScriptedModel, nats_url: str, bus_namespace: str, tmp_path: Path
) -> None:
    # The OpenAI stream waits on its model (an approval would end it at once: Chat Completions
    # cannot carry one); the other doors wait on an approval.
    fake_provider.script(WAITING, Turn.stalled("Thinking it over.", seconds=120), WAITING, WAITING)
    async with ingress_process(nats_url, bus_namespace, tmp_path) as process:

        async def ingress_up() -> bool:
            if process.returncode is not None:
                msg = f"ingress exited with {process.returncode}: {(tmp_path / 'ingress.log').read_text()[-2000:]}"
                raise AssertionError(msg)
            try:
                await asyncio.wait_for(backend.ingress_url(), 1)
            except (BusError, TimeoutError):
                return False  # not answering yet
            return True

        await wait_until(ingress_up, timeout=60, what="the ingress process to serve")
        url = await backend.ingress_url()
        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(30, read=60)) as http:
            readers: list[asyncio.Task[None]] = []
            # An SSE run, quiet while its tool waits for a human: keep-alives flow.
            sse = Lines()
            sse_request = http.build_request("POST", "/atmosphere/agent/notes", content="delete groceries")
            sse_response = await http.send(sse_request, stream=True)
            readers.append(asyncio.create_task(sse.read(sse_response)))
            await sse.until(keep_alive_after_approval)
            sse_run = sse_response.headers["x-atmosphere-run-id"]
            sse_last_seq = max(int(line[4:]) for line in sse.lines if line.startswith("id: "))

            # The OpenAI API, quiet while the model thinks: the stream began with the model's text.
            completion = Lines()
            body = {"model": "notes", "stream": True, "messages": [{"role": "user", "content": "delete groceries"}]}
            completion_response = await http.send(
                http.build_request("POST", "/atmosphere/v1/chat/completions", json=body), stream=True
            )
            readers.append(asyncio.create_task(completion.read(completion_response)))
            await completion.until(lambda lines: ": keep-alive" in lines)

            # A long-poll waiting past the approval request.
            started = (await http.post("/atmosphere/agent/notes/poll", content="delete groceries")).json()
            poll_after = 0
            while True:
                page = (
                    await http.get(f"/atmosphere/runs/{started['runId']}/poll", params={"after": poll_after})
                ).json()
                poll_after = page["after"]
                if any(f.get("event") == "approval-required" for f in page["frames"]):
                    break
            waiting_poll = asyncio.create_task(
                http.get(f"/atmosphere/runs/{started['runId']}/poll", params={"after": poll_after, "wait": 60})
            )

            async with websockets.connect(url.replace("http://", "ws://") + "/atmosphere/agent/notes") as ws:
                await ws.send("delete groceries")
                ws_run = ""
                while True:
                    frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
                    if frame.get("type") == "metadata" and frame.get("key") == "X-Atmosphere-Run-Id":
                        ws_run = frame["value"]
                    if frame.get("event") == "approval-required":
                        break

                process.send_signal(signal.SIGTERM)

                closed = await closing(ws)
            assert closed.rcvd is not None
            assert closed.rcvd.code == 1012
            assert ws_run in closed.rcvd.reason

            await asyncio.wait_for(asyncio.gather(*readers), 30)  # every stream ended
            [drained] = [d for d in sse.data() if d.get("code") == "ingress.draining"]
            assert (drained["runId"], drained["lastSeq"]) == (sse_run, sse_last_seq)
            assert drained["resume"] == f"/atmosphere/runs/{sse_run}/events"
            assert sse.lines[-2:] == [f"data: {json.dumps(drained, separators=(',', ':'))}", ""]

            assert completion.data()[-1]["error"]["type"] == "server_error"
            assert completion.lines[-2:] == ["data: [DONE]", ""]

            answered = await asyncio.wait_for(waiting_poll, 30)
            assert answered.status_code == 200
            assert answered.json()["done"] is False

        assert await asyncio.wait_for(process.wait(), GRACE + 4) == 0
