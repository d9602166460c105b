"""Two users, every transport: nobody reads, resumes, cancels or answers another user's run, or
reaches their history or files, or evicts them. Each refusal is asserted, and that the owner still can.

One stack for the whole module (all six services' real `serve()` on a real nats-server), with
token grants on ingress and on dispatch's gRPC alike.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio
import websockets

from atmosphere.bus import NatsBus, connect, subjects
from atmosphere.bus.runs import send_control
from atmosphere.config import AuthOptions, TokenGrant
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.common.v1.service_pb2 import ServiceInfoRequest, ServiceInfoResponse
from atmosphere.contracts.dispatch.v1 import dispatch_pb2, dispatch_pb2_grpc
from atmosphere.contracts.governance.v1.governance_pb2 import ListDecisionsRequest, ListDecisionsResponse
from atmosphere.contracts.run.v1.run_pb2 import ApprovalDecision, Cancel, Control, RunEvent
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolReply, WorkspaceScope
from atmosphere.ingress.settings import IngressOptions
from atmosphere.service import scoped_conversation
from atmosphere.testing import ScriptedModel, Stack, ToolCallScript, Turn, run_stack, wait_until
from atmosphere.testing.pytest_plugin import delete_namespace_streams

from .conftest import service_map
from .wsclient import read_run, ws_url

pytestmark = pytest.mark.asyncio(loop_scope="module")

ADA = "token-ada-everything"
ADA_ECHO = "token-ada-echo-only"
BOB = "token-bob-everything"
GRANTS = (
    TokenGrant(token=ADA, user_id="ada"),
    TokenGrant(token=ADA_ECHO, user_id="ada", paths=("/atmosphere/agent/echo",)),
    TokenGrant(token=BOB, user_id="bob"),
)
UNKNOWN = {"code": "ingress.unknown_run"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def grpc_auth(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@dataclass
class World:
    stack: Stack
    bus: NatsBus
    provider: ScriptedModel
    url: str
    grpc: str

    def http(self, token: str | None = None) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, headers=bearer(token) if token else {}, timeout=20)

    def socket(self, agent: str, token: str, query: str = "", **headers: str) -> Any:
        return websockets.connect(ws_url(self.url, agent) + query, additional_headers={**bearer(token), **headers})


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    namespace = f"t{uuid.uuid4().hex[:12]}"
    provider = ScriptedModel()
    async with provider.serving(), connect(nats_url, name="cross-user", namespace=namespace) as bus:
        services = service_map(
            nats_url,
            namespace,
            Path(tmp_path_factory.mktemp("cross-user")) / "data",
            app="tests.e2e.cross_user_app:app",
            llm_base_url=provider.base_url,
            ingress={"ingress": IngressOptions(port=0, auth_tokens=GRANTS), "ai_openai_enabled": True},
            dispatch={"ingress": AuthOptions(auth_tokens=GRANTS)},
        )
        try:
            async with run_stack(services, bus=bus) as stack:
                info = await bus.request(subjects.service_info("dispatch"), ServiceInfoRequest(), ServiceInfoResponse)
                yield World(stack, bus, provider, await stack.ingress_url(), json.loads(info.info_json)["grpc"])
        finally:
            await delete_namespace_streams(bus, namespace)


@pytest.fixture(autouse=True)
def fresh_script(world: World) -> Iterator[None]:
    world.provider.turns.clear()
    world.provider.requests.clear()
    yield
    assert not world.provider.turns, "the test left scripted replies unused"


async def next_frame(ws: Any) -> dict[str, Any]:
    frame: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), 10))
    return frame


async def ws_run(world: World, agent: str, token: str, prompt: str) -> list[dict[str, Any]]:
    async with world.socket(agent, token) as ws:
        await ws.send(prompt)
        return await read_run(ws)


async def refused_resume(world: World, agent: str, token: str, run_id: str, how: str) -> dict[str, Any]:
    """Resume `run_id` at `agent`'s route: the first frame, then proof the socket still works."""
    query, headers = ("", {"X-Atmosphere-Run-Id": run_id}) if how == "header" else (f"?{how}={run_id}", {})
    async with world.socket(agent, token, query, **headers) as ws:
        frame = await next_frame(ws)
        await ws.send("still here")
        after = await read_run(ws)
    assert after[-1]["type"] == "complete"
    return frame


def text_of(frames: list[dict[str, Any]]) -> str:
    return "".join(f["data"] for f in frames if f.get("type") == "streaming-text")


def sse_frames(body: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]


def messages_sent(world: World) -> str:
    """Everything the provider was shown in its last request."""
    return json.dumps(world.provider.requests[-1]["messages"])


# -- read and resume ---------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["header", "runId", "X-Atmosphere-Run-Id"])
async def test_a_websocket_resumes_only_its_users_runs(world: World, how: str) -> None:
    run_id = (await ws_run(world, "echo", ADA, "for ada only"))[0]["value"]
    refused = await refused_resume(world, "echo", BOB, run_id, how)
    absent = await refused_resume(world, "echo", BOB, "no-such-run", how)
    assert {k: refused[k] for k in ("type", "code", "data")} == {
        "type": "error",
        "code": "ingress.unknown_run",
        "data": f"Unknown run {run_id}",
    }
    assert absent["data"] == "Unknown run no-such-run"
    assert {k: v for k, v in refused.items() if k != "data"} == {k: v for k, v in absent.items() if k != "data"}
    async with world.socket("echo", ADA, "", **{"X-Atmosphere-Run-Id": run_id}) as ws:
        replay = await read_run(ws)
    assert text_of(replay) == "for ada only"


async def test_a_route_reads_only_its_own_agents_runs(world: World) -> None:
    shout_run = (await ws_run(world, "shout", ADA, "hey"))[0]["value"]
    # Ada's own run, through echo's route: with the echo-only token, and even with a token for both.
    for token in (ADA_ECHO, ADA):
        frame = await refused_resume(world, "echo", token, shout_run, "runId")
        assert frame["code"] == "ingress.unknown_run"
    async with world.http(ADA_ECHO) as http:
        assert (await http.get(f"/atmosphere/runs/{shout_run}/events")).json()["code"] == "ingress.unknown_run"
        assert (await http.get(f"/atmosphere/runs/{shout_run}/poll")).status_code == 404
        assert (await http.post(f"/atmosphere/runs/{shout_run}/cancel")).status_code == 404
    async with world.socket("shout", ADA, f"?runId={shout_run}") as ws:
        assert text_of(await read_run(ws)) == "HEY"


async def test_sse_and_long_poll_resume_only_for_their_user(world: World) -> None:
    async with world.http(ADA) as ada, world.http(BOB) as bob, world.http() as nobody:
        started = await ada.post("/atmosphere/agent/echo", content="sse for ada")
        sse_run = started.headers["x-atmosphere-run-id"]
        polled = (await ada.post("/atmosphere/agent/echo/poll", content="poll for ada")).json()["runId"]
        for route in (f"/atmosphere/runs/{sse_run}/events", f"/atmosphere/runs/{polled}/poll"):
            answer = await bob.get(route)
            assert (answer.status_code, answer.json()["code"]) == (404, UNKNOWN["code"])
            # Nothing of the run leaks: not its text (the run id itself is random hex and may
            # spell anything, so look for what the run said, not for the user's name).
            assert "for ada" not in answer.text
            assert set(answer.json()) == {"error", "code"}
            assert (await nobody.get(route)).status_code == 401
            assert (await bob.get(route.replace(sse_run, "nope").replace(polled, "nope"))).status_code == 404
        resumed = await ada.get(f"/atmosphere/runs/{sse_run}/events", headers={"Last-Event-ID": "1"})
        assert sse_frames(resumed.text)[-1]["type"] == "complete"
        page = (await ada.get(f"/atmosphere/runs/{polled}/poll", params={"wait": 5})).json()
        assert page["frames"][0]["seq"] == 1


# -- cancel and approve ------------------------------------------------------------------------


async def test_only_the_owner_cancels_a_run(world: World) -> None:
    world.provider.script(Turn.stalled("Thinking", seconds=30))
    async with world.http(ADA) as ada, world.http(BOB) as bob:
        run_id = (await ada.post("/atmosphere/agent/notes/poll", content="think hard")).json()["runId"]

        async def thinking() -> bool:
            page = (await ada.get(f"/atmosphere/runs/{run_id}/poll", params={"wait": 1})).json()
            return any(f.get("type") == "streaming-text" for f in page["frames"])

        await wait_until(thinking, what="the run to stream")
        assert (await bob.post(f"/atmosphere/runs/{run_id}/cancel")).json() == {
            "error": f"Unknown run {run_id}",
            "code": "ingress.unknown_run",
        }
        async with grpc.aio.insecure_channel(world.grpc) as channel:
            stub = dispatch_pb2_grpc.DispatchServiceStub(channel)
            cancel = dispatch_pb2.CancelRequest(run_id=run_id)
            with pytest.raises(grpc.aio.AioRpcError) as by_bob:
                await stub.Cancel(cancel, metadata=grpc_auth(BOB))
            assert by_bob.value.code() == grpc.StatusCode.NOT_FOUND
            with pytest.raises(grpc.aio.AioRpcError) as anonymous:
                await stub.Cancel(cancel)
            assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # Past ingress too: the worker itself refuses a cancel that is not from the owner.
        forged = Control(run_id=run_id, cancel=Cancel(reason="forged"), principal=Principal(user_id="bob"))
        assert not (await send_control(world.bus, forged)).accepted
        page = (await ada.get(f"/atmosphere/runs/{run_id}/poll", params={"wait": 0.3})).json()
        assert not page["done"]
        assert (await ada.post(f"/atmosphere/runs/{run_id}/cancel")).json()["accepted"] is True
        tail = (await ada.get(f"/atmosphere/runs/{run_id}/poll", params={"wait": 10})).json()
        assert tail["frames"][-1]["type"] == "error"


async def test_only_the_owner_answers_an_approval(world: World) -> None:
    world.provider.script(Turn.tool_calls(ToolCallScript("delete_note", {"title": "groceries"})), Turn.text("Done."))
    async with world.socket("notes", ADA) as ws:
        await ws.send("delete my groceries note")
        frames = [await next_frame(ws)]
        while frames[-1].get("event") != "approval-required":
            frames.append(await next_frame(ws))
        run_id, approval_id = frames[0]["value"], frames[-1]["data"]["approvalId"]
        answer = f"/__approval/{approval_id}/approve"
        async with world.http(BOB) as bob:
            refused = await bob.post(f"/atmosphere/runs/{run_id}/approval", content=answer)
        assert (refused.status_code, refused.json()["code"]) == (404, "ingress.unknown_run")
        async with world.socket("notes", BOB) as intruder:
            await intruder.send(answer)
            assert (await next_frame(intruder))["code"] == "ingress.unknown_approval"
        forged = Control(
            run_id=run_id,
            approval=ApprovalDecision(approval_id=approval_id, action="approve"),
            principal=Principal(user_id="bob"),
        )
        assert not (await send_control(world.bus, forged)).accepted
        await ws.send(answer)
        while frames[-1].get("type") not in {"complete", "error"}:
            frames.append(await next_frame(ws))
    results = [f["data"] for f in frames if f.get("event") == "tool-result"]
    assert results == [{"toolName": "delete_note", "result": "deleted note 'groceries'"}]


# -- history and files -------------------------------------------------------------------------


async def grpc_run(world: World, token: str, agent: str, message: str, conversation_id: str) -> list[RunEvent]:
    async with grpc.aio.insecure_channel(world.grpc) as channel:
        stub = dispatch_pb2_grpc.DispatchServiceStub(channel)
        request = dispatch_pb2.RunRequest(agent=agent, message=message, conversation_id=conversation_id)
        return [r.event async for r in stub.Run(request, metadata=grpc_auth(token))]


async def sse_run(world: World, token: str, agent: str, message: str, conversation_id: str) -> list[dict[str, Any]]:
    async with world.http(token) as http:
        answer = await http.post(
            f"/atmosphere/agent/{agent}", content=message, headers={"X-Atmosphere-Conversation-Id": conversation_id}
        )
    frames = sse_frames(answer.text)
    assert frames[-1]["type"] == "complete", frames
    return frames


async def test_history_stays_with_its_user_on_sse_and_grpc(world: World) -> None:
    adas_scoped_id = scoped_conversation("diary", Principal(user_id="ada"))
    world.provider.script(Turn.text("Noted."))
    await sse_run(world, ADA, "keeper", "my locker code is 4711", "diary")
    world.provider.script(Turn.text("No idea."), Turn.text("No idea either."))
    await sse_run(world, BOB, "keeper", "what is the locker code?", "diary")
    assert "4711" not in messages_sent(world)
    # Naming Ada's scoped id over gRPC yields a conversation of Bob's own.
    events = await grpc_run(world, BOB, "keeper", "and now?", adas_scoped_id)
    assert events[-1].WhichOneof("kind") == "complete"
    assert "4711" not in messages_sent(world)
    world.provider.script(Turn.text("It is 4711."))
    await grpc_run(world, ADA, "keeper", "what was my code?", "diary")  # the same scoping as ingress
    assert "my locker code is 4711" in messages_sent(world)


def tool_result_seen(world: World) -> str:
    return str(world.provider.requests[-1]["messages"][-1]["content"])


async def read_secret(world: World, token: str, conversation_id: str, *, over: str) -> str:
    world.provider.script(Turn.tool_calls(ToolCallScript("read_file", {"path": "secret.txt"})), Turn.text("Read."))
    if over == "grpc":
        await grpc_run(world, token, "filer", "read it", conversation_id)
    else:
        await sse_run(world, token, "filer", "read it", conversation_id)
    return tool_result_seen(world)


async def test_files_stay_with_their_user_on_sse_and_grpc(world: World) -> None:
    world.provider.script(
        Turn.tool_calls(ToolCallScript("write_file", {"path": "secret.txt", "content": "ada's plans"})),
        Turn.text("Saved."),
    )
    await sse_run(world, ADA, "filer", "save my plans", "desk")
    adas_scoped_id = scoped_conversation("desk", Principal(user_id="ada"))
    assert "ada's plans" not in await read_secret(world, BOB, "desk", over="sse")
    assert "ada's plans" not in await read_secret(world, BOB, adas_scoped_id, over="grpc")
    assert "ada's plans" not in await read_secret(world, BOB, "desk", over="grpc")
    assert "ada's plans" in await read_secret(world, ADA, "desk", over="grpc")


async def test_one_users_flood_of_conversations_never_evicts_anothers_files(world: World) -> None:
    world.provider.script(
        Turn.tool_calls(ToolCallScript("write_file", {"path": "secret.txt", "content": "kept"})), Turn.text("Saved.")
    )
    await sse_run(world, ADA, "filer", "save it", "vault")
    permits = asyncio.Semaphore(8)
    bob = Principal(user_id="bob", auth_method="bearer")

    async def flood(i: int) -> None:
        # What dispatch sends for Bob's file tool call in a conversation of his (scoped at the edge).
        conversation = scoped_conversation(f"flood-{i}", bob)
        call = ToolCall(
            call_id=f"c{i}",
            name="write_file",
            arguments_json=json.dumps({"path": "x.txt", "content": "x"}),
            run_id=f"flood-run-{i}",
            conversation_id=conversation,
            agent="filer",
            principal=bob,
            workspace=WorkspaceScope(category="agents", owner="filer", agent_id="filer", conversation_id=conversation),
        )
        async with permits:
            result = await world.bus.request(subjects.memory_tool("write_file"), call, ToolReply, timeout=10)
        assert not result.is_error, result.content

    await asyncio.gather(*(flood(i) for i in range(260)))
    assert "kept" in await read_secret(world, ADA, "vault", over="sse")


# -- the OpenAI endpoint and gRPC take the same grants -----------------------------------------


async def test_the_openai_endpoint_takes_the_same_grants(world: World) -> None:
    body = {"model": "echo", "messages": [{"role": "user", "content": "hi from bob"}]}
    async with world.http() as nobody, world.http(ADA_ECHO) as echo_only, world.http(BOB) as bob:
        assert (await nobody.post("/atmosphere/v1/chat/completions", json=body)).status_code == 401
        assert (await nobody.get("/atmosphere/v1/models")).status_code == 401
        forbidden = await echo_only.post("/atmosphere/v1/chat/completions", json={**body, "model": "shout"})
        assert (forbidden.status_code, forbidden.json()["error"]["code"]) == (403, "permission_denied")
        answer = await bob.post("/atmosphere/v1/chat/completions", json=body)
    assert answer.status_code == 200
    assert answer.json()["choices"][0]["message"]["content"] == "hi from bob"
    decisions = await world.bus.request(subjects.governance("decisions"), ListDecisionsRequest(), ListDecisionsResponse)
    admits = sorted(
        (d for d in decisions.decisions if d.operation == "admit"), key=lambda d: d.decided_at.ToNanoseconds()
    )
    assert admits[-1].principal == "bob"  # the completion ran as Bob, like his WebSocket runs


async def test_grpc_needs_a_token_and_a_grant_and_its_runs_have_owners(world: World) -> None:
    async with grpc.aio.insecure_channel(world.grpc) as channel:
        stub = dispatch_pb2_grpc.DispatchServiceStub(channel)
        for metadata in ((), grpc_auth("not-a-token"), (("x-api-key", "nope-nope"),)):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.ListAgents(dispatch_pb2.ListAgentsRequest(), metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.GetInfo(dispatch_pb2.GetInfoRequest(), metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            async for _ in stub.Run(dispatch_pb2.RunRequest(agent="shout", message="hi"), metadata=grpc_auth(ADA_ECHO)):
                pass
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        listed = await stub.ListAgents(dispatch_pb2.ListAgentsRequest(), metadata=grpc_auth(ADA_ECHO))
        assert [a.name for a in listed.agents] == ["echo"]
        by_key = await stub.ListAgents(dispatch_pb2.ListAgentsRequest(), metadata=(("x-api-key", BOB),))
        assert len(by_key.agents) == 5
    events = await grpc_run(world, BOB, "echo", "bob over grpc", "")
    assert {e.owner for e in events} == {"bob"}
    run_id = events[0].run_id
    frame = await refused_resume(world, "echo", ADA, run_id, "runId")
    assert frame["code"] == "ingress.unknown_run"
    async with world.socket("echo", BOB, f"?runId={run_id}") as ws:
        assert text_of(await read_run(ws)) == "bob over grpc"
    async with world.http(ADA) as ada:
        assert (await ada.get(f"/atmosphere/runs/{run_id}/events")).status_code == 404
