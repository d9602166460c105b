"""Memory's real `serve()` on a `FakeBus`: history, file tools and the fact screen, wired as deployed."""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from atmosphere.bus import MessageContext, Router, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.governance.v1.governance_pb2 import ScreenedFact, ScreenFactsRequest, ScreenFactsResponse
from atmosphere.contracts.memory.v1.memory_pb2 import (
    AppendTurnRequest,
    AppendTurnResponse,
    ChatMessage,
    GetFactsRequest,
    GetFactsResponse,
    LoadHistoryRequest,
    LoadHistoryResponse,
    SaveFactsRequest,
    SaveFactsResponse,
)
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolReply, WorkspaceScope
from atmosphere.memory.app import serve
from atmosphere.memory.settings import MemorySettings
from atmosphere.testing import running_service

SCOPE = WorkspaceScope(category="agents", owner="planner", agent_id="planner", conversation_id="c1")


@dataclass(frozen=True)
class Running:
    bus: FakeBus
    data: Path
    workspace: Path


def governance_screen() -> Router:
    """A stand-in for governance's fact screen: stores every fact but the one saying "drop"."""

    async def screen(request: ScreenFactsRequest, _ctx: MessageContext) -> ScreenFactsResponse:
        facts = [ScreenedFact(store="drop" not in fact, text=fact, verdict="SAFE") for fact in request.facts]
        return ScreenFactsResponse(facts=facts, tier="RULE_BASED", breach="DROP")

    router = Router()
    router.add(subjects.governance("screen_facts"), ScreenFactsRequest, screen)
    return router


@contextlib.asynccontextmanager
async def memory(tmp_path: Path) -> AsyncIterator[Running]:
    """Memory served by its real `serve()` on a fresh `FakeBus`; stopped and awaited on exit."""
    bus = FakeBus()
    data, workspace = tmp_path / "data", tmp_path / "workspace"
    settings = MemorySettings(data_dir=data, workspace_root=workspace, probe_host="127.0.0.1", probe_port=0)
    async with (
        bus.serve(governance_screen()),
        running_service("memory", functools.partial(serve, bus=bus), settings, bus=bus),
    ):
        yield Running(bus, data, workspace)


async def tool(bus: FakeBus, name: str, arguments: dict[str, str]) -> ToolReply:
    call = ToolCall(call_id=f"call-{name}", name=name, arguments_json=json.dumps(arguments), agent="planner")
    call.workspace.CopyFrom(SCOPE)
    return await bus.request(subjects.memory_tool(name), call, ToolReply)


async def test_serve_keeps_a_conversations_history(tmp_path: Path) -> None:
    turn = AppendTurnRequest(
        conversation_id="c1",
        agent="chat",
        run_id="r1",
        user=ChatMessage(role="user", content="hello"),
        assistant=ChatMessage(role="assistant", content="hi there"),
    )
    async with memory(tmp_path) as running:
        appended = await running.bus.request(subjects.memory("history.append"), turn, AppendTurnResponse)
        history = await running.bus.request(
            subjects.memory("history.load"), LoadHistoryRequest(conversation_id="c1", agent="chat"), LoadHistoryResponse
        )
    assert appended.stored_messages == 2
    assert [(m.role, m.content) for m in history.messages] == [("user", "hello"), ("assistant", "hi there")]
    assert history.next_page_token == ""
    assert (running.data / "memory.db").exists()


async def test_serve_runs_the_file_tools_in_the_configured_workspace(tmp_path: Path) -> None:
    async with memory(tmp_path) as running:
        written = await tool(running.bus, "write_file", {"path": "notes.md", "content": "- milk"})
        read = await tool(running.bus, "read_file", {"path": "notes.md"})
    assert (written.call_id, written.content, written.is_error) == ("call-write_file", "Wrote notes.md", False)
    assert "- milk" in read.content
    assert not read.is_error
    assert (running.workspace / "agents" / "planner" / "files" / "c1" / "notes.md").read_text() == "- milk"


async def test_serve_asks_governance_to_screen_facts_before_storing_them(tmp_path: Path) -> None:
    async with memory(tmp_path) as running:
        saved = await running.bus.request(
            subjects.memory("facts.save"),
            SaveFactsRequest(user_id="ada", facts=["likes tea", "drop me"]),
            SaveFactsResponse,
        )
        recalled = await running.bus.request(
            subjects.memory("facts.get"), GetFactsRequest(user_id="ada"), GetFactsResponse
        )
    assert (saved.stored, saved.dropped) == (1, 1)
    assert list(recalled.facts) == ["likes tea"]
