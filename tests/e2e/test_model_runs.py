"""Model runs through the whole system, with a scripted provider: WebSocket and gRPC alike."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import websockets
from google.protobuf.json_format import MessageToDict
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from atmosphere.bus import NatsBus, subjects
from atmosphere.contracts.common.v1.service_pb2 import ServiceInfoRequest, ServiceInfoResponse
from atmosphere.contracts.dispatch.v1 import dispatch_pb2, dispatch_pb2_grpc
from atmosphere.contracts.governance.v1.governance_pb2 import ListDecisionsRequest, ListDecisionsResponse
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.testing import ScriptedModel, Stack, ToolCallScript, Turn, run_stack, wait_until

from .conftest import service_map
from .wsclient import ask, ws_url

QUESTION = "What time is it in Tokyo, and what is 21 degrees Celsius in Fahrenheit?"


def both_tools() -> list[Turn]:
    return [
        Turn.tool_calls(
            ToolCallScript("local_time", {"city": "Tokyo"}, call_id="call_time"),
            ToolCallScript("celsius_to_fahrenheit", {"celsius": 21}, call_id="call_temp"),
            usage=(120, 30),
        ),
        Turn.text("In Tokyo it is evening, and 21C is 69.8F.", usage=(180, 14)),
    ]


@pytest.fixture
async def stack(
    nats_url: str, bus_namespace: str, nats_bus: NatsBus, tmp_path: Path, fake_provider: ScriptedModel
) -> AsyncIterator[Stack]:
    services = service_map(
        nats_url, bus_namespace, tmp_path / "data", app="examples.assistant:app", llm_base_url=fake_provider.base_url
    )
    async with run_stack(services, bus=nats_bus) as running:
        yield running


async def dispatch_info(bus: NatsBus) -> dict[str, Any]:
    reply = await bus.request(subjects.service_info("dispatch"), ServiceInfoRequest(), ServiceInfoResponse)
    return json.loads(reply.info_json)  # type: ignore[no-any-return]


async def decisions(bus: NatsBus, run_id: str) -> list[tuple[str, str]]:
    reply = await bus.request(
        subjects.governance("decisions"), ListDecisionsRequest(run_id=run_id), ListDecisionsResponse
    )
    return sorted((d.operation, d.subject) for d in reply.decisions)


async def test_two_tools_over_websocket(stack: Stack, fake_provider: ScriptedModel, nats_bus: NatsBus) -> None:
    fake_provider.script(*both_tools())
    frames = await ask(await stack.ingress_url(), "assistant", QUESTION)
    events = [f.get("event") or f.get("type") for f in frames]
    assert events[0] == "metadata"
    assert events[-1] == "complete"
    starts = {f["data"]["toolName"]: f["data"]["arguments"] for f in frames if f.get("event") == "tool-start"}
    assert starts == {"local_time": {"city": "Tokyo"}, "celsius_to_fahrenheit": {"celsius": 21}}
    results = {f["data"]["toolName"]: f["data"]["result"] for f in frames if f.get("event") == "tool-result"}
    assert results["celsius_to_fahrenheit"] == "69.8"
    assert "(Asia/Tokyo)" in results["local_time"]
    usage = [f["data"] for f in frames if f.get("event") == "usage"]
    assert [(u["input"], u["output"]) for u in usage] == [(120, 30), (180, 14)]
    assert "".join(f["data"] for f in frames if f.get("type") == "streaming-text") == (
        "In Tokyo it is evening, and 21C is 69.8F."
    )
    # In order, once each; the one seq missing is the server-side `input` event (the tape has it).
    seqs = [f["seq"] for f in frames]
    assert seqs == sorted(set(seqs))
    assert set(range(1, seqs[-1] + 1)) - set(seqs) == {2}
    # The model saw both tool results before answering.
    tool_messages = [m for m in fake_provider.requests[1]["messages"] if m["role"] == "tool"]
    assert {m["tool_call_id"] for m in tool_messages} == {"call_time", "call_temp"}
    # Governance logged the admission and one check per tool call.
    run_id = frames[0]["value"]
    await wait_until(lambda: _has(decisions(nats_bus, run_id), 3), what="the decision log")
    assert await decisions(nats_bus, run_id) == [
        ("admit", "assistant"),
        ("check_tool", "celsius_to_fahrenheit"),
        ("check_tool", "local_time"),
    ]


async def _has(rows: Any, n: int) -> bool:
    return len(await rows) >= n


async def test_two_tools_over_grpc_with_health_and_reflection(
    stack: Stack, fake_provider: ScriptedModel, nats_bus: NatsBus
) -> None:
    fake_provider.script(*both_tools())
    target = (await dispatch_info(nats_bus))["grpc"]
    async with grpc.aio.insecure_channel(target) as channel:
        stub = dispatch_pb2_grpc.DispatchServiceStub(channel)
        agents = await stub.ListAgents(dispatch_pb2.ListAgentsRequest())
        assistant = next(a for a in agents.agents if a.name == "assistant")
        assert assistant.runtime == "built-in"
        assert "TOOL_CALLING" in assistant.capabilities
        # The agent's own tools, then the harness's (a plain @agent gets the full harness).
        assert list(assistant.tools)[:2] == ["local_time", "celsius_to_fahrenheit"]
        assert {"write_todos", "read_file", "write_file"} <= set(assistant.tools)

        events = [r.event async for r in stub.Run(dispatch_pb2.RunRequest(agent="assistant", message=QUESTION))]
        kinds = [e.WhichOneof("kind") for e in events]
        assert kinds[0] == "metadata"
        assert kinds[-1] == "complete"
        assert kinds.count("tool_start") == 2
        assert kinds.count("tool_result") == 2
        assert kinds.count("usage") == 2
        run_id = events[0].run_id
        # Every stored event once, in order, but the model's input (server side only): seqs skip it.
        stored = [e async for e in nats_bus.replay(subjects.EVENTS_STREAM, subjects.run_events(run_id), RunEvent)]
        assert [e.seq for e in events] == [e.seq for e in stored if e.WhichOneof("kind") != "input"]
        assert "input" not in kinds
        await wait_until(lambda: _has(decisions(nats_bus, run_id), 3), what="the decision log")

        with pytest.raises(grpc.aio.AioRpcError) as missing:
            async for _ in stub.Run(dispatch_pb2.RunRequest(agent="nobody", message="hi")):
                pass
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        assert missing.value.details() == "Unknown agent 'nobody'"
        with pytest.raises(grpc.aio.AioRpcError) as empty:
            async for _ in stub.Run(dispatch_pb2.RunRequest(agent="assistant", message="  ")):
                pass
        assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        answer = await stub.GetInfo(dispatch_pb2.GetInfoRequest())
        info = json.loads(answer.info_json)
        assert info["runtime"]["name"] == "built-in"
        # The same object, typed: a reflection client shows it as JSON, not a string of JSON.
        assert MessageToDict(answer.info) == info

        health = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="atmosphere.contracts.dispatch.v1.DispatchService")
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        async for response in responses:
            names = {s.name for s in response.list_services_response.service}
            assert "atmosphere.contracts.dispatch.v1.DispatchService" in names
            break


async def test_provider_failures_reach_the_client_honestly(stack: Stack, fake_provider: ScriptedModel) -> None:
    url = await stack.ingress_url()
    fake_provider.script(Turn.error("scripted failure", status=429, retry_after=1), Turn.text("One clean answer."))
    started = time.monotonic()
    frames = await ask(url, "assistant", "hello")
    assert time.monotonic() - started >= 1.0
    assert [f.get("type") for f in frames].count("complete") == 1
    assert "error" not in [f.get("type") for f in frames]
    assert "".join(f["data"] for f in frames if f.get("type") == "streaming-text") == "One clean answer."

    fake_provider.script(Turn.truncated("Half an ans"))
    frames = await ask(url, "assistant", "hello")
    assert frames[-1]["type"] == "error"
    assert "complete" not in [f.get("type") for f in frames]

    before = len(fake_provider.requests)
    fake_provider.script(Turn.error("invalid model", status=400), Turn.text("never sent"))
    frames = await ask(url, "assistant", "hello")
    assert frames[-1]["type"] == "error"
    assert frames[-1]["data"] == "API returned 400: invalid model"
    assert len(fake_provider.requests) == before + 1
    fake_provider.turns.clear()


async def test_a_client_that_disconnects_stops_the_model_call(stack: Stack, fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.stalled("Thinking", seconds=30))
    async with websockets.connect(ws_url(await stack.ingress_url(), "assistant")) as ws:
        await ws.send("think hard")
        while True:
            frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
            if frame.get("type") == "streaming-text":
                break
    closed_at = time.monotonic()
    await asyncio.wait_for(fake_provider.disconnected.wait(), 5)
    assert time.monotonic() - closed_at < 10.0  # the stall lasts 30 s; loose for a loaded machine
