"""The MCP client end to end: an agent's model calls tools of two real MCP servers through the choke point.

The six services run through their real `serve()` on a real nats-server; the model is the fake
provider. `docs` is an MCP server (the `mcp` SDK) served over streamable HTTP by uvicorn in this
test; `files` is started over stdio by the sandbox service as its own child. A policy file denies
`call_tool:docs.delete_page`: governance sees MCP tools as `<server>.<tool>`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

import websockets

from atmosphere.bus import NatsBus, subjects
from atmosphere.contracts.common.v1.service_pb2 import ServiceInfoRequest, ServiceInfoResponse
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.tool.v1.tool_pb2 import ToolDescriptor
from atmosphere.ingress.settings import IngressOptions
from atmosphere.sandbox.settings import SandboxOptions
from atmosphere.testing import ScriptedModel, ToolCallScript, Turn, run_stack
from atmosphere.testing.asgi_server import serving_asgi

from .apps.mcp_app import DOCS_URL_ENV
from .apps.mcp_servers import docs_server
from .conftest import service_map
from .wsclient import read_run, ws_url

APP_MODULE = "tests.e2e.apps.mcp_app"
POLICY_FILE = """\
version: "2026-12"
policies:
  - name: no-page-deletes
    type: deny-list
    config:
      regex: ["^call_tool:docs\\\\.delete_page$"]
"""


@contextlib.asynccontextmanager
async def serving_docs() -> AsyncIterator[str]:
    """The docs server over streamable HTTP on a free port; its URL."""
    async with serving_asgi(docs_server().streamable_http_app(), lifespan="on") as port:
        yield f"http://127.0.0.1:{port}/mcp"


@pytest.fixture
async def ingress_url(
    nats_url: str,
    bus_namespace: str,
    nats_bus: NatsBus,
    tmp_path: Path,
    fake_provider: ScriptedModel,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[str]:
    policy = tmp_path / "policies.yaml"
    policy.write_text(POLICY_FILE)
    async with serving_docs() as docs_url:
        monkeypatch.setenv(DOCS_URL_ENV, docs_url)
        monkeypatch.delitem(sys.modules, APP_MODULE, raising=False)  # imported anew with this URL
        services = service_map(
            nats_url,
            bus_namespace,
            tmp_path / "data",
            app=f"{APP_MODULE}:app",
            llm_base_url=fake_provider.base_url,
            ingress={"ingress": IngressOptions(port=0)},
            governance={"governance": {"policy_files": [policy]}},
            # Bounds no loaded machine reaches: starting a Python child and its SDK takes seconds there.
            sandbox={"sandbox": SandboxOptions(mcp_connect_timeout_seconds=60, mcp_list_timeout_seconds=60)},
        )
        async with run_stack(services, bus=nats_bus, timeout=60) as stack:
            yield await stack.ingress_url()


async def ask(url: str, prompt: str) -> list[dict[str, Any]]:
    async with websockets.connect(ws_url(url, "librarian")) as ws:
        await ws.send(prompt)
        return await read_run(ws, timeout=60)


def tool_messages(provider: ScriptedModel) -> dict[str, str]:
    """What the model was told of each call, by call id (in its last request)."""
    return {m["tool_call_id"]: m["content"] for m in provider.requests[-1]["messages"] if m["role"] == "tool"}


async def test_an_agent_calls_mcp_tools_over_http_and_stdio_and_a_policy_denies_one(
    ingress_url: str, nats_bus: NatsBus, fake_provider: ScriptedModel
) -> None:
    fake_provider.script(
        Turn.tool_calls(
            ToolCallScript("docs__search", {"query": "journal"}, call_id="search"),
            ToolCallScript("files__read_file", {"path": "notes.txt"}, call_id="read"),
            ToolCallScript("docs__delete_page", {"title": "Journal"}, call_id="delete"),
        ),
        Turn.text("Found it; I may not delete pages."),
    )
    frames = await ask(ingress_url, "What does the journal do? Then delete its page.")
    assert frames[-1]["type"] == "complete", frames[-1]

    offered = sorted(t["function"]["name"] for t in fake_provider.requests[0]["tools"])
    assert offered == ["docs__delete_page", "docs__search", "files__read_file"]

    told = tool_messages(fake_provider)
    assert told["search"] == "2 pages mention journal"
    assert told["read"].startswith("contents of notes.txt (served by pid ")
    # The stdio server runs as a child of the sandbox service (here: this test's process), not elsewhere.
    assert told["read"].endswith(f"child of {os.getpid()})")
    assert "Tool docs__delete_page denied by policy 'no-page-deletes'" in told["delete"]

    results = {f["data"]["toolName"]: f["data"] for f in frames if f.get("event") == "tool-result"}
    assert set(results) == {"docs__search", "files__read_file"}  # the denied call never started
    started = [f["data"]["toolName"] for f in frames if f.get("event") == "tool-start"]
    assert "docs__delete_page" not in started

    # Runtime truth: the sandbox reports what answered, and the listing is what dispatch offered.
    info = await nats_bus.request(subjects.service_info("sandbox"), ServiceInfoRequest(), ServiceInfoResponse)
    mcp = json.loads(info.info_json)["sandbox"]["mcp"]
    assert mcp == {"docs": "ACTIVE(2 tools)", "files": "ACTIVE(1 tool)"}
    listed = await nats_bus.kv_items(subjects.TOOLS_BUCKET, ToolDescriptor)
    assert sorted(name for name, d in listed.items() if d.provider == "mcp") == offered
    descriptor = await nats_bus.kv_get(subjects.AGENTS_BUCKET, "librarian", AgentDescriptor)
    assert descriptor is not None
    assert sorted(descriptor.tools) == offered  # the agent's listing: what its servers answer with
