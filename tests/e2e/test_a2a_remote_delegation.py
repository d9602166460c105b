"""`delegate_task` to a remote A2A agent served by a second stack.

Two real stacks on one nats-server, each in its own namespace with its own scripted model: B
serves `researcher` over its A2A door (token grants on), A's coordinator `lead` has it as a
remote fleet member whose URL and token A's deployment gives. A's model calls `delegate_task`;
B's agent answers; the answer comes back into A's run as the tool result, its text streamed
into A's stream tagged with the member's name. A's governance denies the edge when a policy
says so, and then B never hears of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import websockets
from pydantic import SecretStr

from atmosphere.bus import connect
from atmosphere.config import TokenGrant
from atmosphere.dispatch.settings import DelegationOptions, RemoteAgentSetting
from atmosphere.ingress.settings import A2aOptions, IngressOptions
from atmosphere.testing import ScriptedModel, ToolCallScript, Turn, run_stack, wait_until
from atmosphere.testing.pytest_plugin import delete_namespace_streams

from .conftest import service_map
from .wsclient import read_run, ws_url

pytestmark = pytest.mark.asyncio(loop_scope="module")

B_TOKEN = "token-of-stack-a-at-b"
POLICY = """\
version: "1.0"
name: no-classified-delegation
rules:
  - name: classified-stays-here
    condition: { field: message, operator: contains, value: "classified" }
    action: deny
    priority: 100
    message: "classified work stays here"
defaults: { action: allow }
"""


@dataclass
class Stacks:
    a_url: str
    b_url: str
    a_model: ScriptedModel
    b_model: ScriptedModel


@contextlib.asynccontextmanager
async def stack(nats_url: str, base: Path, *, app: str, model: ScriptedModel, **overrides: Any) -> AsyncIterator[str]:
    """One stack of the six services in a namespace of its own; its ingress URL."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    async with connect(nats_url, name=base.name, namespace=namespace) as bus:
        services = service_map(nats_url, namespace, base / "data", app=app, llm_base_url=model.base_url, **overrides)
        try:
            async with run_stack(services, bus=bus) as running:
                yield await running.ingress_url()
        finally:
            await delete_namespace_streams(bus, namespace)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stacks(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stacks]:
    a_model, b_model = ScriptedModel(), ScriptedModel()
    a_dir, b_dir = tmp_path_factory.mktemp("stack-a"), tmp_path_factory.mktemp("stack-b")
    policy = a_dir / "policies.yaml"
    policy.write_text(POLICY)
    async with contextlib.AsyncExitStack() as exits:
        await exits.enter_async_context(a_model.serving())
        await exits.enter_async_context(b_model.serving())
        b_url = await exits.enter_async_context(
            stack(
                nats_url,
                b_dir,
                app="tests.e2e.apps.remote_fleet_app:remote_app",
                model=b_model,
                ingress={
                    "ingress": IngressOptions(port=0, auth_tokens=(TokenGrant(token=B_TOKEN, user_id="stack-a"),)),
                    "a2a": A2aOptions(enabled=True),
                },
            )
        )
        remote = RemoteAgentSetting(url=f"{b_url}/atmosphere/a2a/researcher", token=SecretStr(B_TOKEN))
        a_url = await exits.enter_async_context(
            stack(
                nats_url,
                a_dir,
                app="tests.e2e.apps.remote_fleet_app:app",
                model=a_model,
                dispatch={"delegation": DelegationOptions(remotes={"researcher": remote})},
                governance={"governance": {"policy_files": [policy]}},
            )
        )
        yield Stacks(a_url, b_url, a_model, b_model)


@pytest.fixture(autouse=True)
def fresh(stacks: Stacks) -> Any:
    for model in (stacks.a_model, stacks.b_model):
        model.turns.clear()
        model.requests.clear()
    yield
    assert not stacks.a_model.turns, "stack A's script was not used up"
    assert not stacks.b_model.turns, "stack B's script was not used up"


async def converse(url: str, prompt: str) -> list[dict[str, Any]]:
    async with websockets.connect(ws_url(url, "lead")) as ws:
        await ws.send(prompt)
        return await read_run(ws, timeout=60)


def last_user_text(request: dict[str, Any]) -> str:
    return str([m for m in request["messages"] if m["role"] == "user"][-1]["content"])


async def test_the_remote_agent_answers_into_the_coordinators_run(stacks: Stacks) -> None:
    stacks.a_model.script(
        Turn.tool_calls(ToolCallScript("delegate_task", {"agent": "researcher", "message": "Sources on tides?"})),
        Turn.text("The researcher found three."),
    )
    stacks.b_model.script(Turn.text("Three sources on tides: Darwin, Doodson, Munk."))

    frames = await converse(stacks.a_url, "Research tides")

    assert frames[-1]["type"] == "complete", frames[-1]
    results = [f["data"]["result"] for f in frames if f.get("event") == "tool-result"]
    assert results == ["Three sources on tides: Darwin, Doodson, Munk."]
    # B's model got the delegated message, as a run of B's own agent.
    assert [last_user_text(r) for r in stacks.b_model.requests] == ["Sources on tides?"]
    # The remote text streamed into A's stream while it was written, tagged as a sub-run's is:
    # the call's id, A's run as its parent, the member's name.
    remote = [f for f in frames if f.get("event") == "text-delta"]
    assert "".join(f["data"]["text"] for f in remote) == "Three sources on tides: Darwin, Doodson, Munk."
    assert {(f["agent"], f["parentRunId"]) for f in remote} == {("researcher", frames[0]["value"])}
    assert len({f["runId"] for f in remote}) == 1
    assert len(remote) > 1
    own_text = "".join(f["data"] for f in frames if f.get("type") == "streaming-text")
    assert own_text == "The researcher found three."
    # A's model read the remote answer as the tool's result.
    tool_messages = [m for m in stacks.a_model.requests[-1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == ["Three sources on tides: Darwin, Doodson, Munk."]


async def test_governance_denies_the_edge_and_the_remote_never_hears_of_it(stacks: Stacks) -> None:
    stacks.a_model.script(
        Turn.tool_calls(ToolCallScript("delegate_task", {"agent": "researcher", "message": "classified: the plans"})),
        Turn.text("I may not delegate that."),
    )

    frames = await converse(stacks.a_url, "Handle the plans")

    assert frames[-1]["type"] == "complete", frames[-1]
    results = [f["data"]["result"] for f in frames if f.get("event") == "tool-result"]
    assert results == [
        "delegate_task to 'researcher' failed: Request denied by policy no-classified-delegation: "
        "classified work stays here"
    ]
    assert stacks.b_model.requests == []


async def test_cancelling_the_coordinators_run_cancels_the_remote_task(stacks: Stacks) -> None:
    stacks.a_model.script(
        Turn.tool_calls(ToolCallScript("delegate_task", {"agent": "researcher", "message": "Dig deep."})),
    )
    # B's agent starts answering, then would say nothing for longer than the test may take.
    stacks.b_model.script(Turn.stalled("Digging ", seconds=600))
    async with websockets.connect(ws_url(stacks.a_url, "lead")) as ws, httpx.AsyncClient() as http:
        await ws.send("Research everything")
        run_id = ""
        while True:  # until A's client hears B took the task (A knows the task, so it can cancel it)
            frame = json.loads(await asyncio.wait_for(ws.recv(), 60))
            run_id = run_id or frame.get("value", "")
            if frame.get("type") == "progress" and frame.get("agent") == "researcher":
                break
        # B's model is under way too (the stall keeps it so).
        await wait_until(_has_requests(stacks.b_model), timeout=60, what="B's model call")
        cancel = await http.post(f"{stacks.a_url}/atmosphere/runs/{run_id}/cancel")
        assert cancel.json()["accepted"] is True
        frames = await read_run(ws, timeout=60)
    assert frames[-1]["type"] == "error", frames[-1]
    # A's cancel reached B: its run stopped, and with it the model call it was waiting on.
    await asyncio.wait_for(stacks.b_model.disconnected.wait(), 60)


def _has_requests(model: ScriptedModel) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return bool(model.requests)

    return check


async def test_the_info_says_the_remote_member_is_reachable(stacks: Stacks) -> None:
    async with httpx.AsyncClient(base_url=stacks.a_url) as http:
        info = (await http.get("/api/console/info")).json()
    b = httpx.URL(stacks.b_url)
    assert info["remoteAgents"] == {"researcher": f"ACTIVE(a2a http://{b.host}:{b.port})"}
