"""The OpenAI-compatible API with the official `openai` client, and the info/admin surface."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from atmosphere.bus import MessageContext, NatsBus, Router, subjects
from atmosphere.contracts.tape.v1.tape_pb2 import GetStepsRequest, GetStepsResponse
from atmosphere.testing import ScriptedModel, Stack, Turn, run_stack, wait_until

from .conftest import service_map

ADMIN = "admin-token-123"
SETTINGS = {"ai_openai_enabled": True, "ai_openai_default_agent": "assistant", "admin_token": ADMIN}


@pytest.fixture
async def stack(
    nats_url: str,
    bus_namespace: str,
    nats_bus: NatsBus,
    tmp_path: Path,
    fake_provider: ScriptedModel,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Stack]:
    names = getattr(request, "param", ("governance", "memory", "tape", "sandbox", "dispatch", "ingress"))
    services = service_map(
        nats_url,
        bus_namespace,
        tmp_path / "data",
        names,
        app="examples.assistant:app",
        llm_base_url=fake_provider.base_url,
        ingress=SETTINGS,
    )
    async with run_stack(services, bus=nats_bus) as running:
        yield running


async def test_the_official_openai_client_streams_and_completes(stack: Stack, fake_provider: ScriptedModel) -> None:
    base_url = f"{await stack.ingress_url()}/atmosphere/v1"
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)

    fake_provider.script(Turn.text("Streaming works fine.", usage=(11, 4)))
    stream = await client.chat.completions.create(
        model="assistant",
        messages=[{"role": "user", "content": "Stream please"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Streaming works fine."
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (11, 4)

    # Not asked for, no usage chunk (its `choices: []` would break the common loop below),
    # though the model counted tokens.
    fake_provider.script(Turn.text("No usage asked.", usage=(11, 4)))
    plain = await client.chat.completions.create(
        model="assistant", messages=[{"role": "user", "content": "Stream please"}], stream=True
    )
    pieces = [chunk.choices[0].delta.content or "" async for chunk in plain]
    assert "".join(pieces) == "No usage asked."

    fake_provider.script(Turn.text("Whole answer.", usage=(9, 2)))
    completion = await client.chat.completions.create(
        model="assistant",
        messages=[
            {"role": "system", "content": "Be nice."},
            {"role": "user", "content": "Earlier question"},
            {"role": "assistant", "content": "Earlier answer"},
            {"role": "user", "content": "Now?"},
        ],
    )
    assert completion.choices[0].message.content == "Whole answer."
    assert completion.usage is not None
    assert completion.usage.total_tokens == 11
    assert completion.id.startswith("chatcmpl-")
    # Prior turns reached the model as history; the agent kept its own system prompt first.
    sent = fake_provider.requests[-1]["messages"]
    assert sent[0]["content"].startswith("You are a helpful, concise assistant")
    assert sent[1:] == [
        {"role": "system", "content": "Be nice."},
        {"role": "user", "content": "Earlier question"},
        {"role": "assistant", "content": "Earlier answer"},
        {"role": "user", "content": "Now?"},
    ]
    models = await client.models.list()
    assert {m.id for m in models.data} == {"assistant", "echo"}
    await client.close()


async def test_the_sync_client_and_openai_errors(stack: Stack, fake_provider: ScriptedModel) -> None:
    base_url = f"{await stack.ingress_url()}/atmosphere/v1"

    def use_sync_client() -> tuple[str, Any, Any]:
        client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
        with client:
            answer = client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "sync hi"}])
            streamed = "".join(
                c.choices[0].delta.content or ""
                for c in client.chat.completions.create(
                    model="echo", messages=[{"role": "user", "content": "sync stream"}], stream=True
                )
                if c.choices
            )
            with pytest.raises(openai.BadRequestError) as unsupported:
                client.chat.completions.create(
                    model="echo",
                    messages=[{"role": "user", "content": "x"}],
                    functions=[{"name": "f", "parameters": {}}],
                )
            # An unknown model is served by the default agent (ATMOSPHERE_AI_OPENAI_DEFAULT_AGENT).
            fallback = client.chat.completions.create(model="gpt-unknown", messages=[{"role": "user", "content": "x"}])
            with pytest.raises(openai.BadRequestError) as last_not_user:
                client.chat.completions.create(model="echo", messages=[{"role": "assistant", "content": "x"}])
            return (
                f"{answer.choices[0].message.content}|{streamed}|{fallback.choices[0].message.content}",
                unsupported.value,
                last_not_user.value,
            )

    fake_provider.script(Turn.text("From the default agent."))
    text, unsupported, last_not_user = await asyncio.to_thread(use_sync_client)
    assert text == "sync hi|sync stream|From the default agent."
    assert unsupported.body["code"] == "unsupported_parameter"  # type: ignore[index]
    assert unsupported.body["param"] == "functions"  # type: ignore[index]
    assert last_not_user.body["message"].startswith(  # type: ignore[index]
        "The last message must be a user message with content"
    )


async def test_an_api_key_and_a_failing_agent(stack: Stack, fake_provider: ScriptedModel) -> None:
    async with httpx.AsyncClient(base_url=f"{await stack.ingress_url()}/atmosphere/v1") as http:
        # The provider's 400 is the client's 400, with the provider's reason: a retry cannot help.
        fake_provider.script(Turn.error("bad upstream", status=400))
        failed = await http.post("/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
        assert failed.status_code == 400
        assert failed.json()["error"]["type"] == "invalid_request_error"
        assert failed.json()["error"]["message"] == "API returned 400: bad upstream"
        wrong_type = await http.post("/chat/completions", content="{}", headers={"content-type": "text/plain"})
        assert wrong_type.status_code == 415
        wrong_method = await http.post("/models")
        assert wrong_method.json()["error"]["code"] == "method_not_allowed"
        assert wrong_method.headers["allow"] == "GET"


async def test_console_info_merges_what_is_running(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=await stack.ingress_url()) as http:
        info = (await http.get("/api/console/info")).json()
    assert set(info["services"]) == {"ingress", "dispatch", "sandbox", "governance", "memory", "tape"}
    assert info["runtime"]["name"] == "built-in"
    # The table runs are charged with, for a client's estimates (the console's): the shipped one.
    pricing = info["governance"].pop("pricing")
    assert pricing["unit"] == "USD per million tokens"
    assert pricing["models"]["gpt-4o-mini"] == {"input": 0.15, "cachedInput": 0.075, "output": 0.6}
    assert info["governance"] == {
        "policies": [{"name": "admit-all"}],
        "decisionLog": "sqlite",
        "killSwitch": {"armed": False, "reason": None, "operator": None, "armedAt": None},
        "checksOutput": False,  # nothing installed judges answers: none is held back to be checked
    }
    assert info["toolOutputScreen"] == {"active": True, "mode": "ANNOTATE", "tier": "RULE_BASED"}
    assert "ragSafety" not in info  # nothing retrieves documents yet
    assert info["permissionModes"] == {"assistant": "DEFAULT", "echo": "DEFAULT"}
    assert info["sandbox"]["tools"] == ["celsius_to_fahrenheit", "local_time"]
    assert info["tape"]["enabled"] is True
    assert info["memory"]["tools"][0] == "write_todos"
    assert info["memorySafety"] == {"active": True, "tier": "RULE_BASED", "breach": "DROP"}
    # The assistant is a plain @agent: the full harness attached, and says so.
    assert info["harness"]["planning"] == "ACTIVE(builtin)"
    assert info["harness"]["filesystem"] == "ACTIVE(builtin)"
    assert info["harness"]["conversation-memory"] == "ACTIVE"
    assert info["harness"]["delegation"] == "INACTIVE(disabled)"  # no coordinator, flag unset
    assert info["transport"] == ["websocket", "sse", "long-polling"]
    assert info["openAiCompatible"]["defaultAgent"] == "assistant"
    assert info["openAiCompatible"]["apiKeyRequired"] is False
    assert info["hasAdmin"] is True
    assert "auth" not in info  # no token grants configured
    assert "cors" not in info


async def test_admin_reads_are_gated_and_proxied(stack: Stack, fake_provider: ScriptedModel) -> None:
    auth = {"Authorization": f"Bearer {ADMIN}"}
    async with httpx.AsyncClient(base_url=await stack.ingress_url()) as http:
        assert (await http.get("/api/admin/agents")).status_code == 401
        assert (await http.get("/api/admin/agents", headers={"Authorization": "Bearer nope"})).status_code == 401
        agents = (await http.get("/api/admin/agents", headers=auth)).json()
        assert [a["name"] for a in agents] == ["assistant", "echo"]
        tools = (await http.get("/api/admin/tools", headers=auth)).json()
        assert {t["name"] for t in tools} == {"local_time", "celsius_to_fahrenheit"}

        fake_provider.script(Turn.text("Recorded."))
        answer = await http.post(
            "/atmosphere/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
        )
        assert answer.status_code == 200

        async def recorded() -> bool:
            runs = (await http.get("/api/admin/tape/runs", headers=auth)).json()
            return bool(runs) and runs[0]["status"] == "COMPLETED"

        await wait_until(recorded, what="the tape to record the run")
        run_id = (await http.get("/api/admin/tape/runs", headers=auth)).json()[0]["runId"]
        steps = (await http.get(f"/api/admin/tape/runs/{run_id}/steps", headers=auth, params={"fromSeq": 2})).json()
        assert steps["runId"] == run_id
        assert steps["steps"][0]["seq"] == 2
        decisions = (await http.get("/api/admin/governance/decisions", headers=auth, params={"runId": run_id})).json()
        # The seed's row shape (no policy installed: `admit-all` admitted it), with the run it was about.
        assert [(d["operation"], d["decision"], d["policy_name"], d["run_id"]) for d in decisions] == [
            ("admit", "admit", "admit-all", run_id)
        ]
        assert decisions[0]["timestamp"].endswith("Z")
        assert decisions[0]["context_snapshot"]["phase"] == "pre_admission"
        assert (await http.get("/api/admin/tape/runs/..%2F..%2Fetc/steps", headers=auth)).status_code in {400, 404}
        assert (await http.get("/api/admin/tape/runs/a..b/steps", headers=auth)).status_code == 400
        unknown = await http.get("/api/admin/tape/runs/abc123/steps", headers=auth)
        assert unknown.status_code == 404
        assert unknown.json()["code"] == "admin.unknown_run"


@pytest.mark.parametrize("stack", [("governance", "sandbox", "dispatch", "ingress")], indirect=True)
async def test_an_absent_or_silent_owner_is_404_or_503(stack: Stack, nats_bus: NatsBus) -> None:
    auth = {"Authorization": f"Bearer {ADMIN}"}
    async with httpx.AsyncClient(base_url=await stack.ingress_url(), timeout=20) as http:
        absent = await http.get("/api/admin/tape/runs", headers=auth)
        assert absent.status_code == 404
        assert absent.json()["code"] == "admin.absent"
        # Something now holds the tape subject but never answers.
        router = Router()

        async def silent(_request: GetStepsRequest, _ctx: MessageContext) -> GetStepsResponse:
            await asyncio.sleep(6)  # longer than ingress waits (5 s)
            return GetStepsResponse()

        router.add(subjects.tape("steps"), GetStepsRequest, silent)
        async with nats_bus.serve(router):
            # The subscription reaches the server before ingress asks (else: no responder, 404).
            await nats_bus.client.flush()
            silent_answer = await http.get("/api/admin/tape/runs/abc/steps", headers=auth)
        assert silent_answer.status_code == 503
        assert "did not answer" in silent_answer.json()["error"]
