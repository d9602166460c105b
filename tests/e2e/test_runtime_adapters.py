"""Every runtime adapter through real processes: the same agent, the same frames, the same governance.

nats-server, every service (in this process) and one dispatch process per runtime pool
(`ATMOSPHERE_DISPATCH__POOL=<runtime>`, each importing only its own framework); the pools of the
pinned adapters (CrewAI, Semantic Kernel, LlamaIndex) run in their own environment's interpreter
(`.venvs/pinned`), as in images of their own. The scripted provider answers OpenAI's wire,
Anthropic's, Cohere's and Gemini's. A WebSocket client, as any browser, runs `on-<runtime>` (the
same agent pinned to each runtime) and `hosted-<framework>` (each framework's own object): a tool
call and its answer stream the same frames on every runtime as on the built-in one, a tool the
policy denies never runs, a tool that needs approval waits for the client, the tape holds each
run, a hosted object's own tools pass the same gates, and a pool killed with SIGKILL leaves every
other runtime answering.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
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
from atmosphere.testing.pytest_plugin import delete_namespace_streams
from tests.test_runtime_adapters import PINNED_PYTHON, PINNED_RUNTIMES

from .apps.adapters_app import FRAMEWORKS, LEDGER_ENV, RUNTIMES
from .conftest import service_map
from .dispatch_process import Worker, worker_env
from .wsclient import ws_url

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(240)]

APP = "tests.e2e.apps.adapters_app:app"
POOLS = tuple(r for r in RUNTIMES if r != "built-in")
STARTUP = 120.0
"""Seconds a service of the stack may take to start (a safety net, not a measure)."""
CONFIRM = '{"native_transfer": "confirm", "native-transfer": "confirm"}'
"""The operator's tool permissions: a hosted object's own tool needs a human's approval too (Semantic
Kernel names it `native-transfer`: its plugin `native`, its function `transfer`)."""
POLICY_FILE = """\
version: "2026-12"
policies:
  - name: nothing-forbidden
    type: deny-list
    config:
      regex: ["^call_tool:(native[_-])?forbidden$"]
"""
ADMIN = "adapters-admin"
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN}"}
CALLS = {
    "weather": ToolCallScript("lookup", {"city": "Paris"}),
    "forbidden": ToolCallScript("forbidden", {"target": "the vault"}),
    "transfer": ToolCallScript("transfer", {"amount": 5}),
    "native weather": ToolCallScript("native_lookup", {"city": "Oslo"}),
    "native forbidden": ToolCallScript("native_forbidden", {"target": "the vault"}),
    "native transfer": ToolCallScript("native_transfer", {"amount": 7}),
}
"""The prompt a test sends → the one tool call the model answers it with."""


def pool_environment(pool: str, provider: ScriptedModel) -> dict[str, str]:
    """What a pool's process reads besides `LLM_*`: a native SDK's own settings, at the scripted provider."""
    native = {
        "anthropic": {
            "ANTHROPIC_BASE_URL": provider.root_url,
            "ANTHROPIC_API_KEY": "test-key",
            "ANTHROPIC_MODEL": "fake-model",
        },
        "cohere": {"COHERE_BASE_URL": provider.root_url, "CO_API_KEY": "test-key", "COHERE_MODEL": "fake-model"},
        "adk": {
            "GOOGLE_GEMINI_BASE_URL": provider.root_url,
            "GOOGLE_API_KEY": "test-key",
            "GEMINI_MODEL": "fake-model",
        },
    }
    return native.get(pool, {})


def python_of(pool: str) -> str:
    """A pool's interpreter: the pinned environment's for the pinned adapters."""
    return str(PINNED_PYTHON) if pool in PINNED_RUNTIMES else sys.executable


PLAN_STEPS = (
    ToolCallScript("TaskCreate", {"subject": "Find flights", "description": "Cheapest fare"}),
    ToolCallScript("TaskCreate", {"subject": "Book a hotel", "description": "Near the venue"}),
    ToolCallScript("TaskUpdate", {"task_id": "1", "status": "completed"}),
)
"""What the AgentScope planner does, one call a round: plan two steps, finish the first."""


def tool_results(request: ModelRequest) -> int:
    """How many tool results the conversation holds (OpenAI's `tool` messages, Gemini's responses)."""
    return sum(
        1 if m.get("role") == "tool" else sum("functionResponse" in p for p in m.get("parts") or ())
        for m in request.messages
    )


def respond(request: ModelRequest) -> Turn:
    """A tool call first, then an answer quoting what the tool (or its refusal) said."""
    if request.prompt == "plan my trip":
        done = tool_results(request)
        if done < len(PLAN_STEPS):
            step = PLAN_STEPS[done]
            return Turn.tool_calls(ToolCallScript(step.name, step.arguments, call_id=f"plan-{done}"))
        return Turn.text("Flights found.")
    if request.prompt == "write the report" and not tool_results(request):
        return Turn.tool_calls(ToolCallScript("save_report", {"title": "Q4"}, call_id="report-1"))
    if "Research the weather in Paris" in request.prompt:
        return Turn.text("Notes: sunny, 21 degrees.")
    if "Write one line about the weather in Paris" in request.prompt:
        return Turn.text("Paris basks in sunshine.")
    result = request.last_tool_result
    if result is not None:
        return Turn.text(f"Done: {result}")
    call = CALLS[asked(request.prompt)]
    name = own_name("semantic-kernel" if "native-lookup" in request.tools else "", call.name)
    return Turn.tool_calls(ToolCallScript(name, call.arguments, call_id=f"call-{uuid.uuid4().hex[:12]}"))


def asked(prompt: str) -> str:
    """Which scripted prompt a request carries: the prompt itself, or (a crew's task wraps the user's
    message in a prompt of its own) the longest one it contains."""
    if prompt in CALLS:
        return prompt
    return max((key for key in CALLS if key in prompt), key=len)


def own_name(framework: str, tool: str) -> str:
    """A hosted object's own tool as its framework names it (Semantic Kernel: `plugin-function`)."""
    return tool.replace("native_", "native-") if framework == "semantic-kernel" else tool


@dataclass
class World:
    url: str
    bus: NatsBus
    pools: dict[str, Worker]
    grpc: str
    """The default pool's gRPC `DispatchService` (any dispatch serves every pool's agents)."""
    ledger: Path
    reference: list[str] = field(default_factory=list)
    """The frame kinds of the built-in runtime's tool call, what every other runtime must match."""
    capabilities: dict[str, list[str]] = field(default_factory=dict)
    """Each pool's runtime's capabilities, as the console info reports them."""

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
            ingress={"ingress": IngressOptions(port=0), "ai_openai_enabled": True, "admin_token": ADMIN},
            dispatch={
                "dispatch": DispatchOptions(grpc_host="127.0.0.1", grpc_port=0, runtime="built-in", pools=POOLS),
                "tools": ToolOptions.model_validate({"permissions": json.loads(CONFIRM)}),
            },
        )
        pools = {
            pool: Worker(
                worker_env(
                    nats_url,
                    namespace,
                    home / "data",
                    app=APP,
                    provider_url=provider.base_url,
                    durable=False,
                    ATMOSPHERE_DISPATCH__POOL=pool,
                    ATMOSPHERE_DISPATCH__POOLS=",".join(POOLS),
                    ATMOSPHERE_TOOLS__PERMISSIONS=CONFIRM,
                    **pool_environment(pool, provider),
                ),
                home,
                ready_timeout=STARTUP,
                python=python_of(pool),
            )
            for pool in POOLS
        }
        try:
            # The app imports four frameworks (seconds each), in this process and in the sandbox's
            # tool worker: a start on a loaded machine takes longer than the usual bound.
            async with run_stack(services, bus=bus, timeout=STARTUP) as stack:
                try:
                    # One after the other: each imports its framework, and a burst of eleven would
                    # starve the suite's other tests of the CPU.
                    for pool in pools.values():
                        await pool.start()
                    info = await bus.request(
                        subjects.service_info("dispatch"), ServiceInfoRequest(), ServiceInfoResponse
                    )
                    yield World(await stack.ingress_url(), bus, pools, json.loads(info.info_json)["grpc"], ledger)
                finally:
                    for pool in pools.values():
                        await pool.stop()
        finally:
            await delete_namespace_streams(bus, namespace)


async def run(
    world: World, agent: str, prompt: str, *, approve: bool = False, conversation: str = ""
) -> list[dict[str, Any]]:
    """One run over a WebSocket, through its terminal frame; approvals answered when `approve`."""
    frames: list[dict[str, Any]] = []
    done = len(world.ran())
    headers = {"X-Atmosphere-Conversation-Id": conversation} if conversation else {}
    async with websockets.connect(ws_url(world.url, agent), additional_headers=headers) as ws:
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
    """Each frame's kind, consecutive repeats merged (how many deltas a framework streams is its own),
    progress left out (`agent-step`: what an orchestrating runtime, CrewAI's, says of its agents)."""
    named = []
    for frame in frames:
        kind = frame.get("event") or frame.get("type") or "?"
        if kind == "agent-step":
            continue
        if kind == "metadata":
            kind = "tool-call-delta" if frame["key"].startswith("ai.toolCall.delta.") else f"metadata {frame['key']}"
        if not named or named[-1] != kind:
            named.append(kind)
    return named


async def expected_kinds(world: World, pool: str) -> list[str]:
    """The built-in runtime's frames for a tool call (each runtime sends a call's arguments as at
    least one delta: whole, when its provider sends a call whole, as Gemini does); the pools'
    capabilities are kept for the tests that ask."""
    if not world.reference:
        world.reference = kinds(await run(world, "on-built-in", "weather"))
    if not world.capabilities:
        async with httpx.AsyncClient(base_url=world.url, timeout=20) as http:
            pools = (await http.get("/api/console/info")).json()["pools"]
        world.capabilities = {name: p["capabilities"] for name, p in pools.items()}
    assert pool in world.capabilities, pool
    return world.reference


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
    expected = await expected_kinds(world, "default" if runtime == "built-in" else runtime)
    frames = await run(world, f"on-{runtime}", "weather")
    assert kinds(frames) == expected, runtime
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
    lookup, transfer = own_name(framework, "native_lookup"), own_name(framework, "native_transfer")
    frames = await run(world, f"hosted-{framework}", "native weather")
    assert frames[-1]["type"] == "complete", frames[-1]
    assert [e["toolName"] for e in events(frames, "tool-start")] == [lookup]
    assert events(frames, "tool-result") == [{"toolName": lookup, "result": "cloudy in Oslo"}]
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
        (transfer, {"amount": 7})
    ]
    assert events(approved, "tool-result") == [{"toolName": transfer, "result": "moved 7"}]


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_hosted_object_streams_the_same_frames_as_the_built_in_runtime(world: World, framework: str) -> None:
    expected = await expected_kinds(world, framework)
    frames = await run(world, f"hosted-{framework}", "native weather")
    assert kinds(frames) == expected, framework


async def test_agentscopes_task_list_is_the_plan_the_platform_streams_and_stores(world: World) -> None:
    conversation = f"plan-{uuid.uuid4().hex[:8]}"
    frames = await run(world, "planner-agentscope", "plan my trip", conversation=conversation)
    assert text(frames) == "Flights found."
    # Each change of AgentScope's task list reached the plan store, streamed as it happened.
    plans = [[(s["content"], s["status"]) for s in plan["steps"]] for plan in events(frames, "plan-update")]
    assert plans == [
        [("Find flights", "pending")],
        [("Find flights", "pending"), ("Book a hotel", "pending")],
        [("Find flights", "completed"), ("Book a hotel", "pending")],
    ]
    # The model planned with AgentScope's tools: `write_todos` was never offered to it.
    async with httpx.AsyncClient(base_url=world.url, headers=ADMIN_AUTH, timeout=20) as admin:
        stored = (
            await admin.get("/api/admin/agents/planner-agentscope/plan", params={"sessionId": conversation})
        ).json()
        info = (await admin.get("/api/console/info")).json()
    assert [(s["content"], s["status"]) for s in stored["steps"]] == plans[-1]
    assert info["pools"]["agentscope"]["capabilities"].count("PLANNING") == 1


async def test_an_adk_artifact_lands_in_the_conversations_workspace(world: World) -> None:
    conversation = f"files-{uuid.uuid4().hex[:8]}"
    frames = await run(world, "files-adk", "write the report", conversation=conversation)
    assert frames[-1]["type"] == "complete", frames[-1]
    assert text(frames) == "Done: saved report.md (version 0)"
    # The artifact went through the choke point as the workspace's own `write_file`.
    # (The other spelling of the name, `report.md.base64`, is deleted: one artifact, one file.)
    assert [e["toolName"] for e in events(frames, "tool-start")] == ["save_report", "write_file", "delete"]
    async with httpx.AsyncClient(base_url=world.url, headers=ADMIN_AUTH, timeout=20) as admin:
        params = {"sessionId": conversation, "path": "artifacts/report.md"}
        saved = await admin.get("/api/admin/agents/files-adk/files/content", params=params)
    assert saved.status_code == 200, saved.text
    assert saved.json()["content"] == "# Q4\nAll clear."


async def test_a_two_agent_crews_progress_arrives_in_order_before_the_answer(world: World) -> None:
    frames = await run(world, "crew-crewai", "Paris")
    assert frames[-1]["type"] == "complete", frames[-1]
    steps = [(f["data"]["stepName"], f["data"]["data"]["agent"]) for f in frames if f.get("event") == "agent-step"]
    assert steps == [
        ("crewai.task.started", "researcher"),
        ("crewai.agent.started", "researcher"),
        ("crewai.agent.completed", "researcher"),
        ("crewai.task.completed", "researcher"),
        ("crewai.task.started", "writer"),
        ("crewai.agent.started", "writer"),
        ("crewai.agent.completed", "writer"),
        ("crewai.task.completed", "writer"),
    ]
    # The researcher's whole task before the writer's first word; every step before the end.
    at = {
        (f["data"]["stepName"], f["data"]["data"]["agent"]): i
        for i, f in enumerate(frames)
        if f.get("event") == "agent-step"
    }
    first_text = min(i for i, f in enumerate(frames) if f.get("type") == "streaming-text")
    assert at[("crewai.task.completed", "researcher")] < at[("crewai.agent.started", "writer")] < first_text
    assert max(at.values()) < len(frames) - 1
    # The crew's answer is its last task's: the writer's line, not the researcher's notes.
    assert text(frames) == "Paris basks in sunshine."
    info_capabilities = world.capabilities or (await expected_kinds(world, "crewai") and world.capabilities)
    assert "AGENT_ORCHESTRATION" in info_capabilities["crewai"]


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


async def test_a_killed_pool_leaves_every_other_runtime_answering(world: World) -> None:
    # Last in the file: the victim's pool is restarted, but the order of the tests above is kept.
    victim = "crewai"
    world.pools[victim].kill()
    assert world.pools[victim].process is not None
    await world.pools[victim].process.wait()
    waiting = asyncio.create_task(run(world, f"on-{victim}", "weather"))
    for runtime in RUNTIMES:
        if runtime != victim:
            frames = await run(world, f"on-{runtime}", "weather")
            assert text(frames) == "Done: sunny in Paris", runtime
    # Its run waited in its pool's queue, answered by nobody, until its pool came back.
    assert not waiting.done()
    await world.pools[victim].start()
    assert text(await asyncio.wait_for(waiting, 90)) == "Done: sunny in Paris"
