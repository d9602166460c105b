"""Governance end to end: a policy file in force on every edge, seen through clients we did not write.

The six services run through their real `serve()` on a real nats-server; the model is the fake
provider. One policy file (the README's) denies `delete_*` tools, redacts PII in requests and
stops it in answers, and caps each tenant's spend; tenants come from the callers' tokens.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import openai
import pytest
import websockets

from atmosphere.bus import NatsBus, subjects
from atmosphere.config import AuthOptions, TokenGrant
from atmosphere.contracts.common.v1.service_pb2 import ServiceInfoRequest, ServiceInfoResponse
from atmosphere.contracts.dispatch.v1 import dispatch_pb2, dispatch_pb2_grpc
from atmosphere.contracts.governance.v1.governance_pb2 import (
    AdminRequest,
    AdminResponse,
    ListDecisionsRequest,
    ListDecisionsResponse,
)
from atmosphere.dispatch.settings import DispatchOptions
from atmosphere.ingress.settings import IngressOptions
from atmosphere.testing import ScriptedModel, Stack, ToolCallScript, Turn, run_stack
from atmosphere.testing.services import running_service

from .apps.governed_app import CALLS_FILE_ENV
from .conftest import service_map
from .wsclient import read_run, ws_url

POLICY_FILE = """\
version: "2026-12"
policies:
  - name: no-deletes
    type: deny-list
    config:
      regex: ["^call_tool:delete_"]
  - name: no-pii
    type: pii-redaction
    config: {mode: redact}
  - name: spend-cap
    type: cost-ceiling
    config: {budget-usd: 0.01}
"""
PRICING = {"models": {"fake-model": {"input": 1000.0, "output": 1000.0}}}
"""$0.001 a token: a run of 15 tokens spends 0.015, past the 0.01 cap."""
ADMIN = "governance-admin-token"
ALICE, ACME, GLOBEX = "alice-token-0001", "acme-token-00001", "globex-token-001"
GRANTS = (
    TokenGrant(token=ALICE, user_id="alice"),
    TokenGrant(token=ACME, user_id="wile", tenant="acme"),
    TokenGrant(token=GLOBEX, user_id="hank", tenant="globex"),
)
EMAIL = "jane.doe@example.com"
LEAKY = "Here is the account summary you asked for. " * 6 + f"Contact {EMAIL} for refunds. " + "Thanks. " * 30


@dataclass
class World:
    stack: Stack
    bus: NatsBus
    url: str
    calls: Path
    policy_path: Path


@pytest.fixture
async def world(
    nats_url: str,
    bus_namespace: str,
    nats_bus: NatsBus,
    tmp_path: Path,
    fake_provider: ScriptedModel,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[World]:
    calls = tmp_path / "deleted.txt"
    monkeypatch.setenv(CALLS_FILE_ENV, str(calls))
    policy_path = tmp_path / "policies.yaml"
    policy_path.write_text(POLICY_FILE)
    pricing = tmp_path / "pricing.json"
    pricing.write_text(json.dumps(PRICING))
    services = service_map(
        nats_url,
        bus_namespace,
        tmp_path / "data",
        app="tests.e2e.apps.governed_app:app",
        llm_base_url=fake_provider.base_url,
        ingress={
            "ingress": IngressOptions(port=0, auth_tokens=GRANTS),
            "ai_openai_enabled": True,
            "ai_openai_default_agent": "records",
            "admin_token": ADMIN,
        },
        dispatch={"ingress": AuthOptions(auth_tokens=GRANTS)},
        governance={"governance": {"policy_files": [policy_path], "pricing_file": pricing}},
    )
    async with run_stack(services, bus=nats_bus) as stack:
        yield World(stack, nats_bus, await stack.ingress_url(), calls, policy_path)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def ws_run(world: World, token: str, prompt: str) -> list[dict[str, Any]]:
    async with websockets.connect(ws_url(world.url, "records"), additional_headers=bearer(token)) as ws:
        await ws.send(prompt)
        return await read_run(ws)


async def decisions(world: World) -> list[Any]:
    reply = await world.bus.request(
        subjects.governance("decisions"), ListDecisionsRequest(limit=100), ListDecisionsResponse
    )
    return list(reply.decisions)


async def test_a_delete_tool_is_stopped_before_it_starts(world: World, fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("delete_record", {"record_id": "7"})),
        Turn.text("I was not allowed to delete it."),
    )
    frames = await ws_run(world, ALICE, "Please delete record 7")
    assert frames[-1]["type"] == "complete"
    events = [f.get("event") for f in frames]
    assert "tool-start" not in events
    assert "tool-result" not in events
    assert not world.calls.exists()  # and the tool never ran
    # The model was told which policy said no, in the seed's words.
    told = [m for m in fake_provider.requests[-1]["messages"] if m["role"] == "tool"]
    assert json.loads(told[0]["content"]) == {
        "status": "cancelled",
        "message": "Tool delete_record denied by policy 'no-deletes': deny-list: request matched a denied phrase",
    }
    async with httpx.AsyncClient(base_url=world.url, timeout=10, headers=bearer(ADMIN)) as http:
        rows = (await http.get("/api/admin/governance/decisions", params={"limit": 50})).json()
    denial = next(r for r in rows if r["operation"] == "check_tool")
    assert (denial["policy_name"], denial["decision"], denial["subject"]) == ("no-deletes", "deny", "delete_record")
    assert denial["reason"] == "deny-list: request matched a denied phrase"
    assert denial["context_snapshot"]["tool_name"] == "delete_record"
    refused = [d for d in await decisions(world) if d.operation == "check_tool"]
    assert refused[0].subject == "delete_record"
    assert not refused[0].allowed
    assert refused[0].policy == "no-deletes"
    assert refused[0].outcome == "deny"
    assert refused[0].policy_source == f"yaml:{world.policy_path}"
    assert refused[0].policy_version == "2026-12"
    assert refused[0].policy_digest.startswith("sha256:")
    snapshot = json.loads(refused[0].context_json)
    assert snapshot["message"] == "call_tool:delete_record"
    assert snapshot["tool_name"] == "delete_record"


async def test_a_read_tool_still_runs(world: World, fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.tool_calls(ToolCallScript("read_record", {"record_id": "7"})), Turn.text("It is active."))
    frames = await ws_run(world, ALICE, "How is record 7?")
    assert [f["data"]["toolName"] for f in frames if f.get("event") == "tool-result"] == ["read_record"]
    assert frames[-1]["type"] == "complete"


async def test_pii_in_a_request_is_redacted_before_the_model_sees_it(
    world: World, fake_provider: ScriptedModel
) -> None:
    fake_provider.script(Turn.text("Noted."))
    frames = await ws_run(world, ALICE, "My email is bob@corp.example and my phone is +1 415 555 0100")
    assert frames[-1]["type"] == "complete"
    asked = fake_provider.requests[-1]["messages"][-1]["content"]
    assert "bob@corp.example" not in asked
    assert "[redacted-email]" in asked


def _no_email(raw: str) -> None:
    assert "@" not in raw, raw
    assert "jane" not in raw, raw


async def test_an_email_in_a_streamed_answer_never_reaches_a_websocket_client(
    world: World, fake_provider: ScriptedModel
) -> None:
    fake_provider.script(Turn.text(LEAKY, words=False))  # character by character
    async with websockets.connect(ws_url(world.url, "records"), additional_headers=bearer(ALICE)) as ws:
        await ws.send("Summarise my account")
        raw_frames: list[str] = []
        while True:
            raw = str(await asyncio.wait_for(ws.recv(), 10))
            raw_frames.append(raw)
            frame = json.loads(raw)
            if frame.get("type") in {"complete", "error"} and frame.get("seq", 0) > 0:
                break
    for raw in raw_frames:
        _no_email(raw)
    last = json.loads(raw_frames[-1])
    assert last["type"] == "error"
    assert last["code"] == "governance.response_blocked"
    assert last["data"] == "Response blocked: response contains PII of kinds: [email]"
    text = "".join(json.loads(r).get("data", "") for r in raw_frames if json.loads(r).get("type") == "streaming-text")
    assert text.startswith("Here is the account summary")  # what came before it streamed


async def test_an_email_in_a_streamed_answer_never_reaches_an_sse_client(
    world: World, fake_provider: ScriptedModel
) -> None:
    fake_provider.script(Turn.text(LEAKY, words=False))
    async with httpx.AsyncClient(base_url=world.url, timeout=10, headers=bearer(ALICE)) as http:
        response = await http.post("/atmosphere/agent/records", content="Summarise my account")
    assert response.status_code == 200
    _no_email(response.text)
    assert "Response blocked: response contains PII of kinds: [email]" in response.text


async def test_an_email_in_an_answer_never_reaches_an_openai_client(world: World, fake_provider: ScriptedModel) -> None:
    client = openai.AsyncOpenAI(base_url=f"{world.url}/atmosphere/v1", api_key=ALICE, max_retries=0)
    fake_provider.script(Turn.text(LEAKY, words=False))
    stream = await client.chat.completions.create(
        model="records", messages=[{"role": "user", "content": "Summarise my account"}], stream=True
    )
    pieces: list[str] = []

    async def read_all() -> None:
        async for chunk in stream:
            pieces.extend(choice.delta.content or "" for choice in chunk.choices)

    with pytest.raises(openai.APIError, match="Response blocked"):
        await read_all()
    streamed = "".join(pieces)
    _no_email(streamed)
    assert streamed.startswith("Here is the account summary")

    fake_provider.script(Turn.text(LEAKY))
    with pytest.raises(openai.PermissionDeniedError) as blocked:
        await client.chat.completions.create(model="records", messages=[{"role": "user", "content": "Again"}])
    _no_email(str(blocked.value.body))
    assert "Response blocked: response contains PII of kinds: [email]" in str(blocked.value.body)
    await client.close()


async def test_an_email_in_an_answer_never_reaches_a_long_poll_or_grpc_client(
    world: World, fake_provider: ScriptedModel
) -> None:
    fake_provider.script(Turn.text(LEAKY, words=False))
    async with httpx.AsyncClient(base_url=world.url, timeout=40, headers=bearer(ALICE)) as http:
        started = await http.post("/atmosphere/agent/records/poll", content="Summarise my account")
        assert started.status_code == 202
        raw_pages, after, done = [], 0, False
        while not done:
            page = await http.get(
                f"/atmosphere/runs/{started.json()['runId']}/poll", params={"after": after, "wait": 5}
            )
            raw_pages.append(page.text)
            after, done = page.json()["after"], page.json()["done"]
    for raw in raw_pages:
        _no_email(raw)
    assert "Response blocked: response contains PII of kinds: [email]" in raw_pages[-1]

    info = await world.bus.request(subjects.service_info("dispatch"), ServiceInfoRequest(), ServiceInfoResponse)
    fake_provider.script(Turn.text(LEAKY, words=False))
    async with grpc.aio.insecure_channel(json.loads(info.info_json)["grpc"]) as channel:
        stub = dispatch_pb2_grpc.DispatchServiceStub(channel)
        run = dispatch_pb2.RunRequest(agent="records", message="Summarise my account")
        events = [r.event async for r in stub.Run(run, metadata=(("authorization", f"Bearer {ALICE}"),))]
    _no_email("".join(e.text_delta.text for e in events))
    assert events[-1].error.code == "governance.response_blocked"


async def test_a_cost_ceiling_stops_the_next_run_of_that_tenant_only(
    world: World, fake_provider: ScriptedModel
) -> None:
    fake_provider.script(Turn.text("A priced answer.", usage=(11, 4)))
    first = await ws_run(world, ACME, "Hello")
    assert first[-1]["type"] == "complete"
    refused = await ws_run(world, ACME, "Hello again")
    assert refused[-1]["type"] == "error"
    assert refused[-1]["code"] == "governance.denied"
    assert refused[-1]["data"] == (
        "Request denied by policy spend-cap: cost ceiling reached for tenant acme (spent 0.0150 of budget 0.01)"
    )
    fake_provider.script(Turn.text("Another tenant's answer.", usage=(1, 1)))
    other = await ws_run(world, GLOBEX, "Hello")
    assert other[-1]["type"] == "complete"
    summary = await world.bus.request(subjects.governance("admin.summary"), AdminRequest(), AdminResponse)
    spend = json.loads(summary.result_json)["spendUsdByTenant"]
    assert spend == {"acme": 0.015, "globex": 0.002}


async def test_the_seed_ms_example_through_check(world: World) -> None:
    example = world.policy_path.parent / "ms.yaml"
    example.write_text(
        'version: "1.0"\n'
        "name: my-first-policy\n"
        "description: A simple policy that blocks dangerous agent actions\n"
        "rules:\n"
        "  - name: block-delete-database\n"
        "    condition: { field: tool_name, operator: eq, value: delete_database }\n"
        "    action: deny\n"
        "    priority: 100\n"
        '    message: "Deleting databases is not allowed"\n'
        "defaults: { action: allow }\n"
    )
    async with httpx.AsyncClient(base_url=world.url, timeout=10, headers=bearer(ADMIN)) as http:
        swap = {"swapName": "spend-cap", "yaml": example.read_text()}
        anonymous = await http.post("/api/admin/governance/reload", json=swap, headers={"Authorization": ""})
        assert anonymous.status_code == 401  # changing policies always needs the admin token
        reloaded = await http.post("/api/admin/governance/reload", json=swap)
        assert reloaded.status_code == 200
        assert reloaded.json()["reloaded"] == "spend-cap"
        policies = (await http.get("/api/admin/governance/policies")).json()
        assert "my-first-policy" in [p["name"] for p in policies]

        async def check(body: dict[str, Any]) -> dict[str, Any]:
            answer = await http.post("/api/admin/governance/check", json=body)
            assert answer.status_code == 200
            result: dict[str, Any] = answer.json()
            assert isinstance(result.pop("evaluation_ms"), float)
            return result

        denied = await check({"agent_id": "ops", "action": "call_tool", "context": {"tool_name": "delete_database"}})
        allowed = await check({"agent_id": "ops", "action": "call_tool", "context": {"tool_name": "read_table"}})
    assert denied == {
        "allowed": False,
        "decision": "deny",
        "reason": "Deleting databases is not allowed",
        "matched_policy": "my-first-policy",
        "matched_source": "reload:spend-cap",
    }
    assert allowed == {
        "allowed": True,
        "decision": "allow",
        "reason": "",
        "matched_policy": None,
        "matched_source": None,
    }


async def test_governance_going_down_stops_every_edge_closed_and_keeps_what_was_sent(
    nats_url: str, bus_namespace: str, nats_bus: NatsBus, tmp_path: Path, fake_provider: ScriptedModel
) -> None:
    policy_path = tmp_path / "policies.yaml"
    policy_path.write_text(POLICY_FILE)
    services = service_map(
        nats_url,
        bus_namespace,
        tmp_path / "data",
        app="tests.e2e.apps.governed_app:app",
        llm_base_url=fake_provider.base_url,
        dispatch={
            "dispatch": DispatchOptions(grpc_host="127.0.0.1", grpc_port=0, runtime="built-in", governance_timeout=1.0)
        },
        governance={"governance": {"policy_files": [policy_path]}},
    )
    serve_governance, governance_settings = services.pop("governance")
    async with run_stack(services, bus=nats_bus) as stack:
        url = await stack.ingress_url()
        async with running_service("governance", serve_governance, governance_settings, bus=nats_bus):
            fake_provider.script(Turn.text("word " * 400, chunk_delay=0.01))
            ws = await websockets.connect(ws_url(url, "records"))
            await ws.send("Talk to me")
            frames = [json.loads(await asyncio.wait_for(ws.recv(), 10))]
            while frames[-1].get("type") != "streaming-text":
                frames.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
        # Governance stopped while the answer streams: the next check gets no answer.
        frames += await read_run(ws, timeout=15)
        await ws.close()
        assert frames[-1]["type"] == "error"
        assert frames[-1]["data"].startswith("Response blocked: governance is unavailable")
        sent = "".join(f["data"] for f in frames if f.get("type") == "streaming-text")
        assert sent
        assert ("word " * 400).startswith(sent)  # everything checked before the outage was delivered, in order
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            replayed = await http.get(f"/atmosphere/runs/{frames[0]['value']}/events")
        # Nothing accepted is lost: the run's stream still holds every frame the client saw.
        assert sent == "".join(
            json.loads(line[6:]).get("data", "")
            for line in replayed.text.splitlines()
            if line.startswith("data: ") and '"streaming-text"' in line
        )
        # With governance gone, new runs and their tool calls are refused, never run unchecked.
        refused = await ws_ask(url, "Delete record 9")
        assert refused[-1]["type"] == "error"
        assert refused[-1]["code"] == "governance.unavailable"


async def ws_ask(url: str, prompt: str) -> list[dict[str, Any]]:
    async with websockets.connect(ws_url(url, "records")) as ws:
        await ws.send(prompt)
        return await read_run(ws, timeout=15)
