"""Runtime truth through dispatch's real `serve()`: what it reports is what runs.

- With no model configured, `/api/console/info` shows no active runtime and says why, the
  agents carry no runtime, and a run ends with an error naming the setting.
- Agent descriptors live only while a dispatch serves them: after switching apps the lists
  name only the live agents, and a prompt to a gone one is refused up front.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from atmosphere.bus import NatsBus
from atmosphere.config import JetStreamSettings
from atmosphere.testing import Stack, run_stack, running_service, wait_until

from .conftest import service_map
from .wsclient import read_run, ws_url

ADMIN = "admin-token-r"
INGRESS = {"ai_openai_enabled": True, "admin_token": ADMIN}
AUTH = {"Authorization": f"Bearer {ADMIN}"}
AGENTS_MAX_AGE = 3.0
"""Short enough for a test, long enough that a refresh (every second) late on a loaded machine
does not drop a live agent."""


@pytest.fixture
async def modelless(nats_url: str, bus_namespace: str, nats_bus: NatsBus, tmp_path: Path) -> AsyncIterator[Stack]:
    """The whole system serving the assistant with no `LLM_BASE_URL`."""
    services = service_map(
        nats_url, bus_namespace, tmp_path / "data", app="examples.assistant:app", llm_base_url="", ingress=INGRESS
    )
    async with run_stack(services, bus=nats_bus) as running:
        yield running


async def test_without_a_model_the_info_shows_no_active_runtime_and_says_why(modelless: Stack) -> None:
    async with httpx.AsyncClient(base_url=await modelless.ingress_url(), timeout=10) as http:
        info = (await http.get("/api/console/info")).json()
        agents = (await http.get("/api/admin/agents", headers=AUTH)).json()
    assert info["runtime"] == {
        "state": "INACTIVE(no model configured: set LLM_BASE_URL)",
        "name": None,
        "model": None,
        "capabilities": [],
    }
    # No effect journal is attached, so none is claimed.
    assert info["harness"]["durable-runs"] == "INACTIVE(disabled)"
    assistant = next(a for a in agents if a["name"] == "assistant")
    assert (assistant["runtime"], assistant["capabilities"]) == ("", [])


async def test_without_a_model_a_run_ends_with_an_error_naming_the_setting(modelless: Stack) -> None:
    async with websockets.connect(ws_url(await modelless.ingress_url(), "assistant")) as ws:
        await ws.send("What time is it in Paris?")
        frames = await read_run(ws)
    terminal = frames[-1]
    assert terminal["type"] == "error"
    assert terminal["code"] == "runtime.unavailable"
    assert "LLM_BASE_URL" in terminal["data"]
    assert "UnsupportedProtocol" not in json.dumps(frames)


def with_agents_max_age(services: dict[str, tuple[Any, Any]]) -> dict[str, tuple[Any, Any]]:
    """Every service provisions the bucket, so every one gets the same age (as one ConfigMap would)."""
    jetstream = JetStreamSettings(agents_max_age=AGENTS_MAX_AGE)
    return {
        name: (serve, settings.model_copy(update={"jetstream": jetstream}))
        for name, (serve, settings) in services.items()
    }


async def model_ids(http: httpx.AsyncClient) -> set[str]:
    return {m["id"] for m in (await http.get("/atmosphere/v1/models")).json()["data"]}


async def test_after_switching_apps_only_live_agents_are_listed_and_served(
    nats_url: str, bus_namespace: str, nats_bus: NatsBus, tmp_path: Path
) -> None:
    def services(app: str) -> dict[str, tuple[Any, Any]]:
        names = ("governance", "dispatch", "ingress")
        return with_agents_max_age(
            service_map(nats_url, bus_namespace, tmp_path / "data", names, app=app, ingress=INGRESS)
        )

    first = services("examples.echo:app")
    async with run_stack({n: first[n] for n in ("governance", "ingress")}, bus=nats_bus) as stack:
        url = await stack.ingress_url()
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            async with running_service("dispatch", *first["dispatch"], bus=nats_bus):
                await wait_until(lambda: _has(http, {"echo"}), what="echo to be listed")
            async with running_service("dispatch", *services("tests.e2e.apps.ticker:app")["dispatch"], bus=nats_bus):
                await wait_until(lambda: _has(http, {"ticker"}), timeout=20, what="only ticker to be listed")
                await _only_ticker_is_served(http, url)


async def _only_ticker_is_served(http: httpx.AsyncClient, url: str) -> None:
    admin = (await http.get("/api/admin/agents", headers=AUTH)).json()
    assert [a["name"] for a in admin] == ["ticker"]
    # A prompt to the agent no dispatch serves is refused at the door, on every transport.
    gone = await http.post("/atmosphere/agent/echo", content="anyone there?")
    assert (gone.status_code, gone.json()["code"]) == (404, "ingress.unknown_agent")
    assert await _ws_close_code(url, "echo") == 4404
    # The live agent is rewritten before it could expire: still listed well past its age.
    await asyncio.sleep(AGENTS_MAX_AGE * 1.5)
    assert await model_ids(http) == {"ticker"}
    async with websockets.connect(ws_url(url, "ticker")) as ws:
        await ws.send("2 0")
        assert (await read_run(ws))[-1]["type"] == "complete"


async def _has(http: httpx.AsyncClient, expected: set[str]) -> bool:
    return await model_ids(http) == expected


async def _ws_close_code(url: str, agent: str) -> int | None:
    with pytest.raises(websockets.ConnectionClosed) as closed:
        async with websockets.connect(ws_url(url, agent)) as ws:
            await ws.recv()
    return closed.value.rcvd.code if closed.value.rcvd is not None else None
