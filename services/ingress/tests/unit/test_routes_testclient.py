"""Ingress's HTTP routes end to end in-process: the real app and lifespan on a `FakeBus`.

The app is built by `create_app(settings, bus=FakeBus)` and its lifespan runs as in production
(`open_service` on the given bus); requests go through httpx's ASGI transport on the test's own
event loop, so a fake dispatch (a consumer of `ATMO_RUNS` writing each run's events with
`RunEventWriter`) can answer the runs they start.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from atmosphere.bus import ConsumerSpec, WorkItem, subjects
from atmosphere.bus.runs import RunEventWriter
from atmosphere.bus.testing import FakeBus
from atmosphere.config import TokenGrant
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.run.v1.run_pb2 import Complete, RunEvent, RunSubmission, TextDelta
from atmosphere.ingress.api import create_app
from atmosphere.ingress.settings import IngressOptions, IngressSettings

ECHO = AgentDescriptor(name="echo", path="/atmosphere/agent/echo")
GRANT = TokenGrant(token="ada-token-1", user_id="ada", paths=("/atmosphere/agent/echo",))
OTHER_AGENT = AgentDescriptor(name="secret", path="/atmosphere/agent/secret")
ADMIN_TOKEN = "admin-token-1"


async def echo_run(item: WorkItem[RunSubmission], bus: FakeBus) -> None:
    """What a dispatch worker would write for a run: its message back as text, then the end."""
    request = item.envelope.message
    writer = RunEventWriter(bus, request)
    try:
        await writer.emit(RunEvent(text_delta=TextDelta(text=request.message)))
        await writer.emit(RunEvent(complete=Complete(summary=request.message, finish_reason="stop")))
        await writer.flush()
    finally:
        await writer.close()


@contextlib.asynccontextmanager
async def fake_dispatch(bus: FakeBus) -> AsyncIterator[None]:
    """A dispatch stand-in: it consumes the top level of `ATMO_RUNS` and echoes every run."""
    consumer = ConsumerSpec(
        stream=subjects.RUNS_STREAM,
        durable="fake-dispatch",
        filter_subject=subjects.run_submit_level(0),
        batch_fetch=False,
    )

    async def handle(item: WorkItem[RunSubmission]) -> None:
        await echo_run(item, bus)

    async with bus.consume(consumer, RunSubmission, handle):
        yield


@contextlib.asynccontextmanager
async def ingress(settings: IngressSettings, *agents: AgentDescriptor) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of the real ingress app, its lifespan running on a fresh `FakeBus`."""
    bus = FakeBus()
    app = create_app(settings, bus=bus)
    async with app.router.lifespan_context(app):
        for descriptor in agents:
            await bus.kv_put(subjects.AGENTS_BUCKET, descriptor.name, descriptor)
        async with fake_dispatch(bus):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as client:
                yield client


def settings(**overrides: Any) -> IngressSettings:
    """Ingress settings for these tests (the OpenAI API on, admin reads behind a token)."""
    chosen: dict[str, Any] = {
        "ingress": IngressOptions(max_message_bytes=4096),
        "ai_openai_enabled": True,
        "admin_token": ADMIN_TOKEN,
        **overrides,
    }
    return IngressSettings(**chosen)


def sse_frames(body: str) -> list[dict[str, Any]]:
    """The JSON frames of an SSE body (`id:` lines and comments skipped)."""
    return [json.loads(line[len("data: ") :]) for line in body.splitlines() if line.startswith("data: ")]


# -- the agents API ------------------------------------------------------------------------------


async def test_a_prompt_is_answered_with_its_runs_frames_as_sse() -> None:
    async with ingress(settings(), ECHO) as http:
        response = await http.post("/atmosphere/agent/echo", content="hello")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    frames = sse_frames(response.text)
    assert [(f.get("type"), f.get("data")) for f in frames][-2:] == [("streaming-text", "hello"), ("complete", "hello")]
    assert response.headers["x-atmosphere-run-id"]


async def test_an_unknown_agent_is_a_404() -> None:
    async with ingress(settings(), ECHO) as http:
        response = await http.post("/atmosphere/agent/nobody", content="hello")
        poll = await http.post("/atmosphere/agent/nobody/poll", content="hello")
    assert (response.status_code, response.json()) == (
        404,
        {"error": "Unknown agent at /atmosphere/agent/nobody", "code": "ingress.unknown_agent"},
    )
    assert (poll.status_code, poll.json()["code"]) == (404, "ingress.unknown_agent")


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        ('{"prompt": ""}', {}),
        ("   ", {}),
        ("hello", {"x-atmosphere-conversation-id": "../etc"}),
        ("/__approval/apr_000000000000/approve", {}),
    ],
)
async def test_a_malformed_prompt_is_a_400(body: str, headers: dict[str, str]) -> None:
    async with ingress(settings(), ECHO) as http:
        response = await http.post("/atmosphere/agent/echo", content=body, headers=headers)
    assert (response.status_code, response.json()["code"]) == (400, "ingress.bad_request")


async def test_a_prompt_over_the_message_limit_is_a_413_whether_declared_or_not() -> None:
    async with ingress(settings(), ECHO) as http:
        declared = await http.post("/atmosphere/agent/echo", content="x" * 5000)

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(5):
                yield b"x" * 1000

        streamed = await http.post("/atmosphere/agent/echo/poll", content=chunks())
    assert (declared.status_code, declared.json()["code"]) == (413, "ingress.too_large")
    assert (streamed.status_code, streamed.json()["code"]) == (413, "ingress.too_large")


async def test_agent_endpoints_with_grants_answer_401_without_a_token_and_403_outside_the_grant() -> None:
    guarded = settings(ingress=IngressOptions(auth_tokens=(GRANT,)))
    async with ingress(guarded, ECHO, OTHER_AGENT) as http:
        anonymous = await http.post("/atmosphere/agent/echo", content="hello")
        outside = await http.post(
            "/atmosphere/agent/secret", content="hello", headers={"authorization": f"Bearer {GRANT.token}"}
        )
        allowed = await http.post(
            "/atmosphere/agent/echo", content="hello", headers={"authorization": f"Bearer {GRANT.token}"}
        )
        run_read = await http.get(f"/atmosphere/runs/{allowed.headers['x-atmosphere-run-id']}/poll")
    assert (anonymous.status_code, anonymous.json()["code"]) == (401, "ingress.unauthorized")
    assert (outside.status_code, outside.json()["code"]) == (403, "ingress.forbidden")
    assert allowed.status_code == 200
    assert (run_read.status_code, run_read.json()["code"]) == (401, "ingress.unauthorized")


async def test_a_long_poll_run_is_started_then_polled_to_its_end() -> None:
    async with ingress(settings(), ECHO) as http:
        started = await http.post("/atmosphere/agent/echo/poll", content="hello")
        assert started.status_code == 202
        polled = await http.get(started.json()["next"], params={"wait": 10})
        malformed = await http.get("/atmosphere/runs/bad%20id/poll")
        unknown = await http.get("/atmosphere/runs/no-such-run/poll")
    result = polled.json()
    assert result["done"] is True
    assert [f["type"] for f in result["frames"]][-2:] == ["streaming-text", "complete"]
    assert malformed.status_code == 400
    assert (unknown.status_code, unknown.json()["code"]) == (404, "ingress.unknown_run")


async def test_a_finished_run_is_resumed_over_sse_after_the_last_event_id() -> None:
    async with ingress(settings(), ECHO) as http:
        started = await http.post("/atmosphere/agent/echo/poll", content="hello")
        run_id = started.json()["runId"]
        await http.get(started.json()["next"], params={"wait": 10})  # the run is over
        resumed = await http.get(f"/atmosphere/runs/{run_id}/events", headers={"last-event-id": "2"})
    assert resumed.status_code == 200
    assert [f["type"] for f in sse_frames(resumed.text)] == ["complete"]


# -- the OpenAI API ------------------------------------------------------------------------------

CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hello"}]}


async def test_openai_models_and_a_completion() -> None:
    async with ingress(settings(), ECHO) as http:
        models = await http.get("/atmosphere/v1/models")
        completion = await http.post("/atmosphere/v1/chat/completions", json=CHAT)
    assert [m["id"] for m in models.json()["data"]] == ["echo"]
    assert completion.status_code == 200
    assert completion.json()["choices"][0]["message"]["content"] == "hello"


async def test_openai_refusals_are_in_openais_shape() -> None:
    async with ingress(settings(ai_openai_api_key="sk-test-key"), ECHO) as http:
        key = {"authorization": "Bearer sk-test-key"}
        no_key = await http.post("/atmosphere/v1/chat/completions", json=CHAT)
        not_json = await http.post("/atmosphere/v1/chat/completions", content="hi", headers=key)
        too_large = await http.post(
            "/atmosphere/v1/chat/completions",
            content=json.dumps({**CHAT, "user": "u" * 5000}),
            headers={**key, "content-type": "application/json"},
        )
        malformed = await http.post(
            "/atmosphere/v1/chat/completions", content="{nope", headers={**key, "content-type": "application/json"}
        )
        unknown_model = await http.post("/atmosphere/v1/chat/completions", json={**CHAT, "model": "gpt-9"}, headers=key)
    answers = [(r.status_code, r.json()["error"]["code"]) for r in (no_key, not_json, too_large, malformed)]
    assert answers == [
        (401, "invalid_api_key"),
        (415, "unsupported_media_type"),
        (413, "payload_too_large"),
        (400, None),
    ]
    assert (unknown_model.status_code, unknown_model.json()["error"]["code"]) == (404, "model_not_found")
    assert set(malformed.json()["error"]) == {"message", "type", "param", "code"}


# -- admin and docs ------------------------------------------------------------------------------


async def test_admin_reads_need_the_admin_token_and_answer_404_where_nothing_is() -> None:
    admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    async with ingress(settings(), ECHO) as http:
        anonymous = await http.get("/api/admin/agents")
        agents = await http.get("/api/admin/agents", headers=admin)
        nothing = await http.get("/api/admin/no/such/surface", headers=admin)
        no_tape = await http.get("/api/admin/tape/runs", headers=admin)  # no tape service answers
    assert (anonymous.status_code, anonymous.json()["code"]) == (401, "admin.unauthorized")
    assert [a["name"] for a in agents.json()] == ["echo"]
    assert (nothing.status_code, nothing.json()["code"]) == (404, "admin.not_found")
    assert (no_tape.status_code, no_tape.json()["code"]) == (404, "admin.absent")


async def test_admin_reads_without_an_admin_token_configured_are_forbidden() -> None:
    async with ingress(settings(admin_token=""), ECHO) as http:
        refused = await http.get("/api/admin/agents")
    assert (refused.status_code, refused.json()["code"]) == (403, "admin.forbidden")


async def test_docs_and_the_openapi_document_are_served() -> None:
    async with ingress(settings(), ECHO) as http:
        page = await http.get("/docs")
        document = await http.get("/openapi.json")
        missing = await http.get("/docs/assets/nothing.js")
    assert page.status_code == 200
    assert "/atmosphere/agent/{name}" in document.json()["paths"]
    assert (missing.status_code, missing.json()["code"]) == (404, "ingress.not_found")


async def test_agent_names_cannot_be_probed_without_a_token() -> None:
    # Credentials are checked before the agent is looked up: an unknown agent and a known one
    # answer alike (401) without a token; with one, the unknown agent is a 404.
    async with ingress(settings(ingress=IngressOptions(auth_tokens=(GRANT,))), ECHO) as client:
        for path in ("/atmosphere/agent/nobody", "/atmosphere/agent/echo", "/atmosphere/agent/nobody/poll"):
            refused = await client.post(path, content="hi")
            assert refused.status_code == 401, (path, refused.text)
        unknown = await client.post(
            "/atmosphere/agent/nobody", content="hi", headers={"Authorization": "Bearer ada-token-1"}
        )
        assert unknown.status_code == 404


async def test_the_models_list_holds_only_what_the_key_may_use() -> None:
    async with ingress(settings(ingress=IngressOptions(auth_tokens=(GRANT,))), ECHO, OTHER_AGENT) as client:
        listed = await client.get("/atmosphere/v1/models", headers={"Authorization": "Bearer ada-token-1"})
        assert listed.status_code == 200
        assert [m["id"] for m in listed.json()["data"]] == ["echo"]  # not "secret": outside the grant
        assert (await client.get("/atmosphere/v1/models")).status_code == 401


@pytest.mark.parametrize("body", ['{"prompt": "hi"', "[1, 2]", '"just a string"', "not json at all"])
async def test_a_body_declared_json_that_is_not_a_prompt_object_is_a_400(body: str) -> None:
    async with ingress(settings(), ECHO) as client:
        for path in ("/atmosphere/agent/echo", "/atmosphere/agent/echo/poll"):
            refused = await client.post(path, content=body, headers={"Content-Type": "application/json"})
            assert refused.status_code == 400, (path, body, refused.text)
        # The same text as plain text is a prompt, as it always was.
        answered = await client.post("/atmosphere/agent/echo", content=body, headers={"Content-Type": "text/plain"})
        assert answered.status_code == 200
        assert sse_frames(answered.text)[-1]["type"] == "complete"
