"""Ingress as clients meet it: SSE, long-poll, resumable WebSockets, slow clients, approvals, auth."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from atmosphere.bus import NatsBus, subjects
from atmosphere.contracts.governance.v1.governance_pb2 import ListDecisionsRequest, ListDecisionsResponse
from atmosphere.ingress.settings import IngressOptions, TokenGrant
from atmosphere.testing import ScriptedModel, Stack, ToolCallScript, Turn, run_stack

from .conftest import service_map
from .wsclient import assert_each_seq_once, read_run, ws_url

LONG = " ".join(f"word{i}" for i in range(40))


@pytest.fixture
async def stack(
    nats_url: str,
    bus_namespace: str,
    nats_bus: NatsBus,
    tmp_path: Path,
    fake_provider: ScriptedModel,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Stack]:
    ingress = getattr(request, "param", {})
    services = service_map(
        nats_url,
        bus_namespace,
        tmp_path / "data",
        app="examples.approvals:app",
        llm_base_url=fake_provider.base_url,
        ingress=ingress,
    )
    async with run_stack(services, bus=nats_bus) as running:
        yield running


def parse_sse(body: str) -> list[tuple[int, dict[str, Any]]]:
    events = []
    for block in body.strip().split("\n\n"):
        if block.startswith(":"):
            continue  # a keep-alive comment
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        events.append((int(fields["id"]), json.loads(fields["data"])))
    return events


async def test_sse_streams_with_ids_and_resumes_after_last_event_id(stack: Stack) -> None:
    url = await stack.ingress_url()
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        response = await http.post("/atmosphere/agent/echo", content="one two three four")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        run_id = response.headers["x-atmosphere-run-id"]
        events = parse_sse(response.text)
        assert [i for i, _ in events] == [f["seq"] for _, f in events] == list(range(1, 7))
        assert events[-1][1]["type"] == "complete"

        resumed = await http.get(f"/atmosphere/runs/{run_id}/events", headers={"Last-Event-ID": "3"})
        assert [i for i, _ in parse_sse(resumed.text)] == [4, 5, 6]

        assert (await http.post("/atmosphere/agent/nobody", content="hi")).status_code == 404
        assert (await http.post("/atmosphere/agent/echo", content="   ")).json()["code"] == "ingress.bad_request"
        assert (await http.get("/atmosphere/runs/nope/events")).status_code == 404
        assert (await http.get("/atmosphere/runs/a..b/events")).status_code == 400


async def test_long_poll_delivers_every_frame_once(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=await stack.ingress_url(), timeout=40) as http:
        started = await http.post("/atmosphere/agent/echo/poll", content="polling is fine")
        assert started.status_code == 202
        after, frames, done = 0, [], False
        next_url = started.json()["next"]
        while not done:
            page = (await http.get(next_url.replace("after=0", f"after={after}"), params={"wait": 5})).json()
            frames += page["frames"]
            after, done = page["after"], page["done"]
        assert [f["seq"] for f in frames] == list(range(1, len(frames) + 1))
        assert "".join(f["data"] for f in frames if f["type"] == "streaming-text") == "polling is fine"
        # Polling at the end answers at once that the run is over (a client re-polling its last
        # position must not spin on `done: false`).
        tail = (await http.get(f"/atmosphere/runs/{started.json()['runId']}/poll", params={"after": after})).json()
        assert tail == {"frames": [], "done": True, "after": after}
    # So does a WebSocket resuming at the end: the terminal frame again, not a silent socket.
    resume = f"?X-Atmosphere-Run-Id={started.json()['runId']}&lastSeq={after}"
    async with websockets.connect(ws_url(await stack.ingress_url(), "echo") + resume) as ws:
        again = json.loads(await asyncio.wait_for(ws.recv(), 10))
    assert (again["type"], again["seq"], again["runId"]) == ("complete", after, started.json()["runId"])


async def test_a_websocket_cut_after_its_fifth_frame_resumes_with_every_seq_once(
    stack: Stack, fake_provider: ScriptedModel
) -> None:
    fake_provider.script(Turn.text(LONG, chunk_delay=0.03))
    url = await stack.ingress_url()
    first: list[dict[str, Any]] = []
    ws = await websockets.connect(ws_url(url, "assistant"))
    await ws.send("tell me a long story")
    while len(first) < 5:
        first.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
    ws.transport.abort()  # the network drops: no close frame
    run_id = first[0]["value"]

    last_seq = first[-1]["seq"]  # the fifth frame's seq (seqs skip the server-side model input)
    async with websockets.connect(
        ws_url(url, "assistant") + f"?X-Atmosphere-Run-Id={run_id}&lastSeq={last_seq}"
    ) as again:
        rest = await read_run(again)
    assert_each_seq_once(first + rest)
    assert rest[-1]["type"] == "complete"
    text = "".join(f["data"] for f in first + rest if f.get("type") == "streaming-text")
    assert text == LONG

    # A finished run replays whole to its terminal frame.
    async with websockets.connect(ws_url(url, "assistant"), additional_headers={"X-Atmosphere-Run-Id": run_id}) as ws:
        replay = await read_run(ws)
    assert [f["seq"] for f in replay] == [f["seq"] for f in first + rest]


@pytest.mark.parametrize("stack", [{"ingress": IngressOptions(port=0, send_queue_frames=16)}], indirect=True)
async def test_a_client_too_slow_is_closed_and_resumes(stack: Stack, fake_provider: ScriptedModel) -> None:
    long_words = " ".join("w" * 200 + str(i) for i in range(3000))
    fake_provider.script(Turn.text(long_words))
    url = await stack.ingress_url()
    ws = await websockets.connect(ws_url(url, "assistant"), max_queue=1)
    await ws.send("flood me")
    first = json.loads(await asyncio.wait_for(ws.recv(), 10))
    run_id = first["value"]
    await asyncio.sleep(3)  # read nothing while thousands of frames come

    async def drain() -> None:
        while True:
            await asyncio.wait_for(ws.recv(), 10)

    with pytest.raises(websockets.ConnectionClosed) as closed:
        await drain()
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 4008
    assert "resume" in closed.value.rcvd.reason
    async with websockets.connect(ws_url(url, "assistant") + f"?runId={run_id}", max_size=None) as again:
        replay = await read_run(again, timeout=30)
    assert_each_seq_once(replay)
    assert replay[-1]["type"] == "complete"


async def test_approvals_over_websocket(stack: Stack, fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.tool_calls(ToolCallScript("delete_note", {"title": "groceries"})), Turn.text("Done."))
    async with websockets.connect(ws_url(await stack.ingress_url(), "notes")) as ws:
        await ws.send("delete my groceries note")
        frames: list[dict[str, Any]] = []
        while True:
            frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
            frames.append(frame)
            if frame.get("event") == "approval-required":
                approval = frame["data"]
                assert approval["toolName"] == "delete_note"
                assert approval["arguments"] == {"title": "groceries"}
                await ws.send(f"/__approval/{approval['approvalId']}/approve")
            if frame.get("type") in {"complete", "error"}:
                break
        await ws.send("/__approval/apr_ffffffffffff/approve")
        unknown = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert unknown["code"] == "ingress.unknown_approval"
    results = [f["data"] for f in frames if f.get("event") == "tool-result"]
    assert results == [{"toolName": "delete_note", "result": "deleted note 'groceries'"}]


async def test_an_approval_outlives_the_socket_that_was_asked(stack: Stack, fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.tool_calls(ToolCallScript("delete_note", {"title": "groceries"})), Turn.text("Done."))
    url = await stack.ingress_url()
    first: list[dict[str, Any]] = []
    ws = await websockets.connect(ws_url(url, "notes"))
    await ws.send("delete my groceries note")
    while not first or first[-1].get("event") != "approval-required":
        first.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
    ws.transport.abort()  # the client goes away without answering
    run_id, asked = first[0]["value"], first[-1]

    # Back again (a reloaded page): resumed from before the question, it is asked again and answered here.
    before = first[-2]["seq"]
    async with websockets.connect(ws_url(url, "notes") + f"?X-Atmosphere-Run-Id={run_id}&lastSeq={before}") as again:
        rest: list[dict[str, Any]] = []
        while not rest or rest[-1].get("type") not in {"complete", "error"}:
            frame = json.loads(await asyncio.wait_for(again.recv(), 10))
            rest.append(frame)
            if frame.get("event") == "approval-required":
                assert frame["data"]["approvalId"] == asked["data"]["approvalId"]  # the same pending approval
                await again.send(f"/__approval/{frame['data']['approvalId']}/approve")
    assert rest[0]["seq"] == asked["seq"]
    results = [f["data"] for f in rest if f.get("event") == "tool-result"]
    assert results == [{"toolName": "delete_note", "result": "deleted note 'groceries'"}]
    assert rest[-1]["type"] == "complete"


GRANTS = (TokenGrant(token="token-ada-123", user_id="ada", paths=("/atmosphere/agent/echo",)),)


@pytest.mark.parametrize("stack", [{"ingress": IngressOptions(port=0, auth_tokens=GRANTS)}], indirect=True)
async def test_tokens_guard_agent_endpoints(stack: Stack) -> None:
    url = await stack.ingress_url()
    targets = (
        (ws_url(url, "echo"), 4401),
        (ws_url(url, "assistant") + "?access_token=token-ada-123", 4403),
        # An unknown agent is a 4401 without a token too: agent names cannot be probed.
        (ws_url(url, "nobody"), 4401),
        (ws_url(url, "nobody") + "?access_token=token-ada-123", 4404),
    )
    for target, code in targets:
        with pytest.raises(websockets.ConnectionClosed) as closed:
            async with websockets.connect(target) as ws:
                await ws.recv()
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == code
    headers = {"Authorization": "Bearer token-ada-123"}
    async with websockets.connect(ws_url(url, "echo"), additional_headers=headers) as ws:
        await ws.send("hi ada")
        frames = await read_run(ws)
    assert frames[-1]["type"] == "complete"
    # The principal travelled with the run: governance logged it.
    reply = await stack.bus.request(
        subjects.governance("decisions"), ListDecisionsRequest(run_id=frames[0]["value"]), ListDecisionsResponse
    )
    assert [d.principal for d in reply.decisions] == ["ada"]
    async with httpx.AsyncClient(base_url=url) as http:
        assert (await http.post("/atmosphere/agent/echo", content="x")).status_code == 401
        assert (
            await http.post("/atmosphere/agent/echo", content="x", headers={"X-API-Key": "token-ada-123"})
        ).status_code == 200
