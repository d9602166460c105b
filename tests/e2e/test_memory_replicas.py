"""Memory as several replicas on a real nats-server: one state, whichever replica answers.

Each replica is memory's real `serve()` with its own data directory and workspace root, as two
pods with their own volumes are. A write acknowledged by one replica is read back from another
at once, a replica stopped for good loses nothing (the survivor answers), and a replica started
later on an empty volume catches up from `ATMO_MEMORY` before it answers.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from atmosphere.bus import NatsBus, NoRespondersError, subjects
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
from atmosphere.testing import run_stack, running_service, wait_until

from .conftest import service_map

SCOPE = WorkspaceScope(category="agents", owner="planner", agent_id="planner", conversation_id="c1")


def memory_replica(nats_url: str, namespace: str, root: Path) -> tuple[Any, Any]:
    """Memory's (serve, settings) with a volume of its own under `root`."""
    return service_map(nats_url, namespace, root, ("memory",))["memory"]


async def append(bus: NatsBus, n: int) -> AppendTurnResponse:
    turn = AppendTurnRequest(
        conversation_id="c1",
        agent="chat",
        run_id=f"r{n}",
        user=ChatMessage(role="user", content=f"question {n}"),
        assistant=ChatMessage(role="assistant", content=f"answer {n}"),
    )
    turn.compaction.max_messages = 1000
    return await bus.request(subjects.memory("history.append"), turn, AppendTurnResponse)


async def history(bus: NatsBus) -> list[str]:
    loaded = await bus.request(
        subjects.memory("history.load"), LoadHistoryRequest(conversation_id="c1", agent="chat"), LoadHistoryResponse
    )
    return [m.content for m in loaded.messages]


async def serves(bus: NatsBus) -> bool:
    try:
        await history(bus)
    except NoRespondersError:
        return False
    return True


async def tool(bus: NatsBus, name: str, arguments: dict[str, str]) -> ToolReply:
    call = ToolCall(call_id=f"call-{name}", name=name, arguments_json=json.dumps(arguments), agent="planner")
    call.workspace.CopyFrom(SCOPE)
    return await bus.request(subjects.memory_tool(name), call, ToolReply)


def turns(count: int) -> list[str]:
    return [text for n in range(count) for text in (f"question {n}", f"answer {n}")]


@pytest.mark.timeout(120)
async def test_memory_replicas_hold_one_state_through_a_failover_and_a_late_replica(
    nats_url: str, bus_namespace: str, nats_bus: NatsBus, tmp_path: Path
) -> None:
    governance = service_map(nats_url, bus_namespace, tmp_path / "gov", ("governance",))
    first = memory_replica(nats_url, bus_namespace, tmp_path / "a")
    async with run_stack(governance, bus=nats_bus):
        replica_a = contextlib.AsyncExitStack()
        await replica_a.enter_async_context(running_service("memory", *first, bus=nats_bus))
        try:
            for n in range(3):
                await append(nats_bus, n)
            written = await tool(nats_bus, "write_file", {"path": "notes.md", "content": "- milk"})
            saved = await nats_bus.request(
                subjects.memory("facts.save"), SaveFactsRequest(user_id="ada", facts=["likes tea"]), SaveFactsResponse
            )
            assert not written.is_error, written.content
            assert saved.stored == 1
            # A second replica joins; then the first goes away for good.
            second = memory_replica(nats_url, bus_namespace, tmp_path / "b")
            async with running_service("memory", *second, bus=nats_bus):
                await replica_a.aclose()
                # The second serves once it applied the log (its health is the first's until then).
                await wait_until(lambda: serves(nats_bus), what="the second replica to serve")
                assert await history(nats_bus) == turns(3)
                read = await tool(nats_bus, "read_file", {"path": "notes.md"})
                assert "- milk" in read.content, read.content
                facts = await nats_bus.request(
                    subjects.memory("facts.get"), GetFactsRequest(user_id="ada"), GetFactsResponse
                )
                assert list(facts.facts) == ["likes tea"]
                # A late replica on an empty volume, beside the survivor: every answer from
                # either one holds every write acknowledged before it.
                late = memory_replica(nats_url, bus_namespace, tmp_path / "c")
                async with running_service("memory", *late, bus=nats_bus):
                    for n in range(3, 23):
                        appended = await append(nats_bus, n)
                        assert appended.stored_messages == 2 * (n + 1)
                        assert await history(nats_bus) == turns(n + 1)
                        listed = await tool(nats_bus, "ls", {"dir": "."})
                        assert "notes.md" in listed.content, listed.content
        finally:
            await replica_a.aclose()
    for volume in ("b", "c"):
        assert (tmp_path / volume / "workspace" / "agents" / "planner" / "files" / "c1" / "notes.md").read_text() == (
            "- milk"
        )
