"""Every runtime adapter through real processes: the same agent, the same frames, the same governance.

nats-server, every service (in this process) and one dispatch process per runtime pool
(`ATMOSPHERE_DISPATCH__POOL=<runtime>`, each with only its own framework imported by its runs);
the scripted provider answers OpenAI's wire and Anthropic's. A WebSocket client, as any browser,
runs `on-<runtime>` (the same agent pinned to each runtime) and `hosted-<framework>` (each
framework's own object): a tool call and its answer stream the same frames on every runtime as on
the built-in one, a tool the policy denies never runs, a tool that needs approval waits for the
client, the tape holds each run, and a hosted object's own tools pass the same gates.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio
import websockets

from atmosphere.bus import NatsBus, connect, subjects
from atmosphere.contracts.common.v1.service_pb2 import ServiceInfoRequest, ServiceInfoResponse
from atmosphere.contracts.dispatch.v1 import dispatch_pb2, dispatch_pb2_grpc
from atmosphere.contracts.tape.v1.tape_pb2 import GetStepsRequest, GetStepsResponse
from atmosphere.dispatch.settings import DispatchOptions, ToolOptions
from atmosphere.ingress.settings import IngressOptions
from atmosphere.testing import ModelRequest, ScriptedModel, ToolCallScript, Turn, run_stack, wait_until
from atmosphere.testing.model_turns import block_text
from atmosphere.testing.pytest_plugin import delete_namespace_streams

from .apps.adapters_app import FRAMEWORKS, LEDGER_ENV, RUNTIMES
from .conftest import service_map
from .dispatch_process import Worker, worker_env
from .wsclient import ws_url

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(240)]

APP = "tests.e2e.apps.adapters_app:app"
POOLS = tuple(r for r in RUNTIMES if r != "built-in")
STARTUP = 120.0
"""Seconds a service of the stack may take to start (a safety net, not a measure)."""
CONFIRM = '{"native_transfer": "confirm"}'
"""The operator's tool permissions: a hosted object's own tool needs a human's approval too."""
POLICY_FILE = """\
version: "2026-12"
policies:
  - name: nothing-forbidden
    type: deny-list
    config:
      regex: ["^call_tool:(native_)?forbidden$"]
"""
CALLS = {
    "weather": ToolCallScript("lookup", {"city": "Paris"}),
    "forbidden": ToolCallScript("forbidden", {"target": "the vault"}),
    "transfer": ToolCallScript("transfer", {"amount": 5}),
    "native weather": ToolCallScript("native_lookup", {"city": "Oslo"}),
    "native forbidden": ToolCallScript("native_forbidden", {"target": "the vault"}),
    "native transfer": ToolCallScript("native_transfer", {"amount": 7}),
}
"""The prompt a test sends → the one tool call the model answers it with."""


def prompt_of(request: ModelRequest) -> str:
    """The run's prompt: the first user message's text (OpenAI's and Anthropic's wire alike)."""
    first = next(m for m in request.messages if m.get("role") == "user")
    return block_text(first.get("content"))


def respond(request: ModelRequest) -> Turn:
    """A tool call first, then an answer quoting what the tool (or its refusal) said."""
    result = request.last_tool_result
    if result is not None:
        return Turn.text(f"Done: {result}")
    call = CALLS[prompt_of(request)]
    return Turn.tool_calls(ToolCallScript(call.name, call.arguments, call_id=f"call-{uuid.uuid4().hex[:12]}"))


@dataclass
class World:
    url: str
    bus: NatsBus
    grpc: str
    """The default pool's gRPC `DispatchService` (any dispatch serves every pool's agents)."""
    ledger: Path
    reference: list[str] = field(default_factory=list)
    """The frame kinds of the built-in runtime's tool call, what every other runtime must match."""

    def ran(self) -> list[str]:
        return self.ledger.read_text().splitlines()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    namespace = f"t{uuid.uuid4().hex[:12]}"
    home = Path(tmp_path_factory.mktemp("adapters"))
    ledger = home / "ledger.txt"
    ledger.touch()
    os.environ[LEDGER_ENV] = str(ledger)  # the sandbox runs in this process; the pools inherit it
    policy = home / "policies.yaml"
    policy.write_text(POLICY_FILE)
    provider = ScriptedModel(function=respond)
    async with provider.serving(), connect(nats_url, name="adapters", namespace=namespace) as bus:
        services = service_map(
            nats_url,
            namespace,
            home / "data",
            app=APP,
            llm_base_url=provider.base_url,
            governance={"governance": {"policy_files": [policy]}},
            sandbox={"sandbox": {"tool_workers": 1}},
            ingress={"ingress": IngressOptions(port=0), "ai_openai_enabled": True},
            dispatch={
                "dispatch": DispatchOptions(grpc_host="127.0.0.1", grpc_port=0, runtime="built-in", pools=POOLS),
                "tools": ToolOptions.model_validate({"permissions": json.loads(CONFIRM)}),
            },
        )
        pools = [
            Worker(
                worker_env(
                    nats_url,
                    namespace,
                    home / "data",
                    app=APP,
                    provider_url=provider.base_url,
                    durable=False,
                    ATMOSPHERE_DISPATCH__POOL=pool,
                    ATMOSPHERE_DISPATCH__POOLS=",".join(POOLS),
                    ANTHROPIC_BASE_URL=provider.anthropic_base_url,
                    ANTHROPIC_API_KEY="test-key",
                    ANTHROPIC_MODEL="fake-model",
                    ATMOSPHERE_TOOLS__PERMISSIONS=CONFIRM,
                ),
                home,
                ready_timeout=STARTUP,
            )
            for pool in POOLS
        ]
        try:
            # The app imports four frameworks (seconds each), in this process and in the sandbox's
            # tool worker: a start on a loaded machine takes longer than the usual bound.
            async with run_stack(services, bus=bus, timeout=STARTUP) as stack:
                try:
                    # One after the other: each imports four frameworks, and a burst of five would
                    # starve the suite's other tests of the CPU.
                    for pool in pools:
                        await pool.start()
                    info = await bus.request(
                        subjects.service_info("dispatch"), ServiceInfoRequest(), ServiceInfoResponse
                    )
                    yield World(await stack.ingress_url(), bus, json.loads(info.info_json)["grpc"], ledger)
                finally:
                    for pool in pools:
                        await pool.stop()
        finally:
            await delete_namespace_streams(bus, namespace)


async def run(world: World, agent: str, prompt: str, *, approve: bool = False) -> list[dict[str, Any]]:
    """One run over a WebSocket, through its terminal frame; approvals answered when `approve`."""
    frames: list[dict[str, Any]] = []
    done = len(world.ran())
    async with websockets.connect(ws_url(world.url, agent)) as ws:
        await ws.send(prompt)
        while True:
            frame = json.loads(await asyncio.wait_for(ws.recv(), 60))
            frames.append(frame)
            if frame.get("event") == "approval-required" and approve:
                assert len(world.ran()) == done, "the tool ran before it was approved"
                await ws.send(f"/__approval/{frame['data']['approvalId']}/approve")
            if frame.get("type") in {"complete", "error"} and frame.get("seq", 0) > 0:
                return frames


def kinds(frames: list[dict[str, Any]]) -> list[str]:
    """Each frame's kind, consecutive repeats merged (how many deltas a framework streams is its own)."""
    named = []
    for frame in frames:
        kind = frame.get("event") or frame.get("type") or "?"
        if kind == "metadata":
            kind = "tool-call-delta" if frame["key"].startswith("ai.toolCall.delta.") else f"metadata {frame['key']}"
        if not named or named[-1] != kind:
            named.append(kind)
    return named


def text(frames: list[dict[str, Any]]) -> str:
    return "".join(f["data"] for f in frames if f.get("type") == "streaming-text")


def events(frames: list[dict[str, Any]], event: str) -> list[Any]:
    return [f["data"] for f in frames if f.get("event") == event]


async def taped(world: World, frames: list[dict[str, Any]]) -> GetStepsResponse:
    run_id = frames[0]["value"]
    request = GetStepsRequest(run_id=run_id)

    async def completed() -> bool:
        steps = await world.bus.request(subjects.tape("steps"), request, GetStepsResponse)
        return steps.run.status == "COMPLETED"

    await wait_until(completed, timeout=20, what=f"the tape to hold run {run_id}")
    return await world.bus.request(subjects.tape("steps"), request, GetStepsResponse)


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_tool_call_streams_the_same_frames_on_every_runtime(world: World, runtime: str) -> None:
    if not world.reference:
        world.reference = kinds(await run(world, "on-built-in", "weather"))
    frames = await run(world, f"on-{runtime}", "weather")
    assert kinds(frames) == world.reference, runtime
    # What the built-in runtime streams: the run id, the call's arguments as they stream, the
    # round's usage, the call, its result, the answer, its round's usage, the end.
    assert world.reference == [
        "metadata X-Atmosphere-Run-Id",
        "tool-call-delta",
        "usage",
        "tool-start",
        "tool-result",
        "streaming-text",
        "usage",
        "complete",
    ]
    assert events(frames, "tool-result") == [{"toolName": "lookup", "result": "sunny in Paris"}]
    assert text(frames) == "Done: sunny in Paris"
    steps = await taped(world, frames)
    assert steps.run.agent == f"on-{runtime}"
    assert {"tool-start", "tool-result", "complete"} <= {s.kind for s in steps.steps}


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_denied_tool_never_runs_on_any_runtime(world: World, runtime: str) -> None:
    frames = await run(world, f"on-{runtime}", "forbidden")
    assert frames[-1]["type"] == "complete"
    assert "denied by policy 'nothing-forbidden'" in text(frames)
    assert events(frames, "tool-result") == []
    assert not [line for line in world.ran() if line.startswith("forbidden")]


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_an_approval_waits_for_the_client_on_every_runtime(world: World, runtime: str) -> None:
    frames = await run(world, f"on-{runtime}", "transfer", approve=True)
    asked = events(frames, "approval-required")
    assert [(a["toolName"], a["arguments"]) for a in asked] == [("transfer", {"amount": 5})]
    assert events(frames, "tool-result") == [{"toolName": "transfer", "result": "transferred 5"}]
    assert text(frames) == "Done: transferred 5"


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_hosted_object_is_served_with_its_tools_governed(world: World, framework: str) -> None:
    frames = await run(world, f"hosted-{framework}", "native weather")
    assert frames[-1]["type"] == "complete", frames[-1]
    assert [e["toolName"] for e in events(frames, "tool-start")] == ["native_lookup"]
    assert events(frames, "tool-result") == [{"toolName": "native_lookup", "result": "cloudy in Oslo"}]
    assert text(frames) == "Done: cloudy in Oslo"
    assert "usage" in kinds(frames)
    steps = await taped(world, frames)
    assert steps.run.agent == f"hosted-{framework}"

    refused = await run(world, f"hosted-{framework}", "native forbidden")
    assert refused[-1]["type"] == "complete"
    assert "denied by policy 'nothing-forbidden'" in text(refused)
    assert not [line for line in world.ran() if line.startswith("native_forbidden")]

    approved = await run(world, f"hosted-{framework}", "native transfer", approve=True)
    assert [(a["toolName"], a["arguments"]) for a in events(approved, "approval-required")] == [
        ("native_transfer", {"amount": 7})
    ]
    assert events(approved, "tool-result") == [{"toolName": "native_transfer", "result": "moved 7"}]


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_hosted_object_streams_the_same_frames_as_the_built_in_runtime(world: World, framework: str) -> None:
    if not world.reference:
        world.reference = kinds(await run(world, "on-built-in", "weather"))
    frames = await run(world, f"hosted-{framework}", "native weather")
    assert kinds(frames) == world.reference, framework


async def test_the_console_info_shows_every_pool_and_its_runtime(world: World) -> None:
    async with httpx.AsyncClient(base_url=world.url, timeout=20) as http:
        pools = (await http.get("/api/console/info")).json()["pools"]
    assert sorted(pools) == sorted(["default", *POOLS])
    assert {name: (p["runtime"], p["state"]) for name, p in pools.items()} == {
        "default": ("built-in", "ACTIVE"),
        **{pool: (pool, "ACTIVE") for pool in POOLS},
    }
    assert sorted(pools["langgraph"]["agents"]) == ["hosted-langgraph", "on-langgraph"]
    assert "TOOL_CALLING" in pools["anthropic"]["capabilities"]


async def test_every_door_reaches_an_agent_in_another_pool(world: World) -> None:
    # The OpenAI API, SSE and gRPC (to the default pool's dispatch) queue runs in the agent's own pool.
    async with httpx.AsyncClient(base_url=world.url, timeout=60) as http:
        body = {"model": "on-pydantic-ai", "messages": [{"role": "user", "content": "weather"}]}
        completion = (await http.post("/atmosphere/v1/chat/completions", json=body)).json()
        assert completion["choices"][0]["message"]["content"] == "Done: sunny in Paris"
        sse = await http.post("/atmosphere/agent/hosted-openai-agents", content="native weather")
        assert sse.status_code == 200
        frames = [json.loads(line[6:]) for line in sse.text.splitlines() if line.startswith("data: {")]
        assert text(frames) == "Done: cloudy in Oslo"
    async with grpc.aio.insecure_channel(world.grpc) as channel:
        stub = dispatch_pb2_grpc.DispatchServiceStub(channel)
        request = dispatch_pb2.RunRequest(agent="hosted-langgraph", message="native weather")
        texts = [r.event.text_delta.text async for r in stub.Run(request) if r.event.HasField("text_delta")]
    assert "".join(texts) == "Done: cloudy in Oslo"
