"""Memory's writes through its write log: two replicas on one bus, one state, applies that repeat safely."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atmosphere.bus import JetStreamLayout
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.governance.v1.governance_pb2 import ScreenedFact, ScreenFactsRequest, ScreenFactsResponse
from atmosphere.contracts.memory.v1.memory_pb2 import (
    AppendTurnRequest,
    ChatMessage,
    LoadHistoryRequest,
    MemoryWrite,
    SaveFactsRequest,
)
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, WorkspaceScope
from atmosphere.memory.app import replicated
from atmosphere.memory.handlers import MemoryHandlers
from atmosphere.memory.store import MemoryStore
from atmosphere.memory.workspaces import Workspaces
from atmosphere.sdk import ChatMessage as Message
from atmosphere.service.replica import ReplicaPosition

SCOPE = WorkspaceScope(category="agents", owner="planner", agent_id="planner", conversation_id="c1")
CTX: Any = None


async def screen(request: ScreenFactsRequest) -> ScreenFactsResponse:
    return ScreenFactsResponse(facts=[ScreenedFact(store=True, text=f, verdict="SAFE") for f in request.facts])


def turn(n: int) -> AppendTurnRequest:
    return AppendTurnRequest(
        conversation_id="c1",
        agent="chat",
        user=ChatMessage(role="user", content=f"q{n}"),
        assistant=ChatMessage(role="assistant", content=f"a{n}"),
    )


@dataclass
class Replica:
    handlers: MemoryHandlers
    workspace: Path


@contextlib.asynccontextmanager
async def replica(bus: FakeBus, root: Path, name: str) -> AsyncIterator[Replica]:
    """One memory replica: its own store and workspace, its writes through the shared log."""
    async with (
        MemoryStore.open(root / name / "memory.db") as store,
        replicated(
            bus, store, Workspaces(root / name / "workspace"), screen, position=ReplicaPosition(root / name, "memory")
        ) as handlers,
    ):
        yield Replica(handlers, root / name / "workspace")


async def test_what_one_replica_wrote_the_other_reads(tmp_path: Path) -> None:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    async with replica(bus, tmp_path, "a") as a, replica(bus, tmp_path, "b") as b:
        appended = [await (a if n % 2 else b).handlers.append_turn(turn(n), CTX) for n in range(4)]
        call = ToolCall(
            call_id="w", name="write_file", arguments_json=json.dumps({"path": "n.md", "content": "x"}), agent="planner"
        )
        call.workspace.CopyFrom(SCOPE)
        written = await a.handlers.tool(call, CTX)
        saved = await b.handlers.save_facts(SaveFactsRequest(user_id="ada", facts=["likes tea"]), CTX)
        seen = [
            await r.handlers.load_history(LoadHistoryRequest(conversation_id="c1", agent="chat"), CTX) for r in (a, b)
        ]
    assert [r.stored_messages for r in appended] == [2, 4, 6, 8]
    assert [[m.content for m in s.messages] for s in seen] == [[f"{k}{n}" for n in range(4) for k in "qa"]] * 2
    assert (written.content, saved.stored) == ("Wrote n.md", 1)
    for r in (a, b):
        assert (r.workspace / "agents" / "planner" / "files" / "c1" / "n.md").read_text() == "x"


async def test_a_turn_applied_again_after_a_crash_is_not_appended_twice(tmp_path: Path) -> None:
    async with MemoryStore.open(tmp_path / "memory.db") as store:
        handlers = MemoryHandlers(store, Workspaces(tmp_path / "workspace"), screen)
        first = await handlers.apply(7, MemoryWrite(append_turn=turn(1)))
        again = await handlers.apply(7, MemoryWrite(append_turn=turn(1)))
        later = await handlers.apply(9, MemoryWrite(append_turn=turn(2)))
        older = await handlers.apply(8, MemoryWrite(append_turn=turn(3)))  # behind the last applied: a repeat
        history = await store.history_page("chat", "c1", "", max_bytes=1 << 20)
    assert (first.stored_messages, again.stored_messages, later.stored_messages, older.stored_messages) == (2, 2, 4, 4)
    assert [m.content for m in history.messages] == ["q1", "a1", "q2", "a2"]


async def test_a_turn_without_a_log_sequence_is_always_appended(tmp_path: Path) -> None:
    async with MemoryStore.open(tmp_path / "memory.db") as store:
        for _ in range(2):
            await store.append_turn(
                "chat",
                "c1",
                Message("user", "q"),
                Message("assistant", "a"),
                strategy="sliding-window",
                max_messages=20,
            )
        history = await store.history_page("chat", "c1", "", max_bytes=1 << 20)
    assert len(history.messages) == 4


async def test_a_turn_sent_again_is_stored_once_and_another_turn_of_the_run_is_not_lost(tmp_path: Path) -> None:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    first, other = turn(1), turn(2)
    first.run_id = other.run_id = "r1"
    async with replica(bus, tmp_path, "a") as a:
        stored = [(await a.handlers.append_turn(t, CTX)).stored_messages for t in (first, first, other)]
    assert stored == [2, 2, 4]
