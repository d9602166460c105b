"""The first real run: WebSocket → ingress → ATMO_RUNS → dispatch → events → ingress, and tape."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from typing import Any

import httpx
import pytest
import websockets

from atmosphere.bus import NatsBus, subjects
from atmosphere.contracts.common.v1.service_pb2 import HealthCheckRequest, HealthCheckResponse
from atmosphere.contracts.tape.v1.tape_pb2 import GetStepsRequest, GetStepsResponse
from atmosphere.testing import run_stack, wait_until

from .wsclient import ask, read_run, ws_url


def assert_well_formed(frames: list[dict[str, Any]], words: str) -> str:
    session_ids = {f["sessionId"] for f in frames}
    assert len(session_ids) == 1
    assert [f["seq"] for f in frames] == list(range(1, len(frames) + 1))
    first, *texts, last = frames
    assert first["type"] == "metadata"
    assert first["key"] == "X-Atmosphere-Run-Id"
    assert all(f["type"] == "streaming-text" for f in texts)
    assert len(texts) == len(words.split(" "))
    assert "".join(f["data"] for f in texts) == words
    assert last["type"] == "complete"
    return str(first["value"])


async def test_echo_over_websocket_is_recorded_by_the_tape(services: dict[str, Any], nats_bus: NatsBus) -> None:
    async with run_stack(services, bus=nats_bus) as stack:
        url = await stack.ingress_url()
        frames = await ask(url, "echo", "hello brave new world")
        run_id = assert_well_formed(frames, "hello brave new world")

        async def recorded() -> bool:
            steps = await nats_bus.request(subjects.tape("steps"), GetStepsRequest(run_id=run_id), GetStepsResponse)
            return steps.run.status == "COMPLETED"

        await wait_until(recorded, what="the tape to record the run")
        steps = await nats_bus.request(subjects.tape("steps"), GetStepsRequest(run_id=run_id), GetStepsResponse)
        # The four text frames are one coalesced `text` step, at the seq of the first.
        assert [s.kind for s in steps.steps] == ["metadata", "text", "complete"]
        assert [s.seq for s in steps.steps] == [frames[0]["seq"], frames[1]["seq"], frames[-1]["seq"]]
        assert json.loads(steps.steps[1].payload_json)["text"] == "hello brave new world"
        assert steps.run.agent == "echo"
        assert steps.run.session_id == frames[0]["sessionId"]


async def test_every_service_reports_ready(services: dict[str, Any], nats_bus: NatsBus) -> None:
    async with run_stack(services, bus=nats_bus) as stack:
        for name in services:
            health = await nats_bus.request(subjects.service_health(name), HealthCheckRequest(), HealthCheckResponse)
            assert health.ready, name
            assert health.service == name
        async with httpx.AsyncClient(base_url=await stack.ingress_url()) as http:
            body = (await http.get("/readyz")).json()
            # `instance` names the process (host:pid): `atmosphere dev` counts only its own children.
            assert body == {"ready": True, "service": "ingress", "instance": f"{socket.gethostname()}:{os.getpid()}"}
            assert (await http.get("/healthz")).status_code == 200


async def test_unknown_agents_and_bad_frames_get_clear_errors(services: dict[str, Any], nats_bus: NatsBus) -> None:
    async with run_stack(services, bus=nats_bus) as stack:
        url = await stack.ingress_url()
        with pytest.raises(websockets.ConnectionClosed) as closed:
            async with websockets.connect(ws_url(url, "nobody")) as ws:
                await ws.recv()
        assert closed.value.rcvd is not None
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4404, "Unknown agent 'nobody'")

        async with websockets.connect(ws_url(url, "echo")) as ws:
            await ws.send('{"prompt": ""}')
            error = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert error["type"] == "error"
            assert "prompt" in error["data"]
            # The connection stays usable.
            await ws.send(json.dumps({"prompt": "still here", "hints": {"maxCost": 1}}))
            assert_well_formed(await read_run(ws), "still here")


async def test_two_prompts_on_one_connection_stream_concurrently(services: dict[str, Any], nats_bus: NatsBus) -> None:
    async with run_stack(services, bus=nats_bus) as stack:
        async with websockets.connect(ws_url(await stack.ingress_url(), "echo")) as ws:
            await ws.send("first prompt")
            await ws.send("second prompt here")
            frames: list[dict[str, Any]] = []
            while sum(f.get("type") == "complete" for f in frames) < 2:
                frames.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
        by_session: dict[str, list[dict[str, Any]]] = {}
        for frame in frames:
            by_session.setdefault(frame["sessionId"], []).append(frame)
        texts = sorted(
            "".join(f.get("data", "") for f in run if f["type"] == "streaming-text") for run in by_session.values()
        )
        assert texts == ["first prompt", "second prompt here"]
        for run in by_session.values():
            assert [f["seq"] for f in run] == list(range(1, len(run) + 1))
