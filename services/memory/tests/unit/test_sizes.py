"""Every answer of memory's fits in one bus message: pages, offsets and clear cut markers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from atmosphere.bus import RemoteError, subjects
from atmosphere.bus.sizes import ENVELOPE_ROOM
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.governance.v1.governance_pb2 import ScreenedFact, ScreenFactsRequest, ScreenFactsResponse
from atmosphere.contracts.memory.v1.memory_pb2 import (
    GetFactsRequest,
    GetFactsResponse,
    ListFilesRequest,
    ListFilesResponse,
    LoadHistoryRequest,
    LoadHistoryResponse,
    ReadFileRequest,
    ReadFileResponse,
    ReplaceHistoryRequest,
    ReplaceHistoryResponse,
    SaveFactsRequest,
    SaveFactsResponse,
)
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolReply, WorkspaceScope
from atmosphere.memory.handlers import MemoryHandlers
from atmosphere.memory.store import MemoryStore
from atmosphere.memory.store import StalePageTokenError as HistoryChangedError
from atmosphere.memory.workspaces import Workspaces
from atmosphere.sdk import ChatMessage as Message
from atmosphere.sdk.compaction import history_digest

LIMIT = 64 * 1024


@dataclass
class Screen:
    requests: list[ScreenFactsRequest] = field(default_factory=list)

    async def __call__(self, request: ScreenFactsRequest) -> ScreenFactsResponse:
        self.requests.append(request)
        return ScreenFactsResponse(facts=[ScreenedFact(store=True, text=f, verdict="SAFE") for f in request.facts])


@dataclass
class Memory:
    bus: FakeBus
    store: MemoryStore
    screen: Screen
    workspaces: Workspaces

    def write(self, path: str, content: str) -> None:
        """A file larger than one bus message can carry (written in parts over time, say)."""
        self.workspaces.files(SCOPE).write(path, content)

    async def ask(self, op: str, request: Any, reply: type[Any]) -> Any:
        return await self.bus.request(subjects.memory(op), request, reply)

    async def tool(self, name: str, arguments: dict[str, Any]) -> ToolReply:
        call = ToolCall(call_id="k", name=name, arguments_json=json.dumps(arguments), workspace=SCOPE)
        return await self.bus.request(subjects.memory_tool(name), call, ToolReply)

    async def pages(self, agent: str = "chat", conversation_id: str = "c1") -> list[LoadHistoryResponse]:
        pages: list[LoadHistoryResponse] = []
        token = ""
        while True:
            page = await self.ask(
                "history.load",
                LoadHistoryRequest(agent=agent, conversation_id=conversation_id, page_token=token),
                LoadHistoryResponse,
            )
            pages.append(page)
            if not page.next_page_token:
                return pages
            token = page.next_page_token


SCOPE = WorkspaceScope(category="agents", owner="chat", agent_id="chat", conversation_id="c1")


@pytest.fixture
async def memory(tmp_path: Path) -> AsyncIterator[Memory]:
    # A broker limit of 64 KiB: below the store's own bounds (256 KiB a message, 512 KiB a file).
    bus = FakeBus(max_payload=LIMIT)
    screen = Screen()
    workspaces = Workspaces(tmp_path / "ws")
    async with MemoryStore.open(tmp_path / "memory.db") as store:
        handlers = MemoryHandlers(store, workspaces, screen, max_payload=LIMIT)
        async with bus.serve(handlers.router()):
            yield Memory(bus, store, screen, workspaces)


def joined(pages: list[LoadHistoryResponse]) -> list[tuple[str, str]]:
    messages: list[list[str]] = []
    joining = False
    for page in pages:
        for message in page.messages:
            if joining:
                messages[-1][1] += message.content
            else:
                messages.append([message.role, message.content])
            joining = message.partial
    return [(role, content) for role, content in messages]


async def fill(store: MemoryStore, turns: list[tuple[str, str]], conversation_id: str = "c1") -> None:
    await store.replace_history("chat", conversation_id, [Message(r, c) for r, c in turns])


# -- history in pages ------------------------------------------------------------------------------


async def test_a_history_larger_than_one_message_comes_in_pages_that_add_up(memory: Memory) -> None:
    history = [
        turn for i in range(4) for turn in (("user", f"q{i} " + "ä" * 20_000), ("assistant", f"a{i} " + "b" * 30_000))
    ]  # ~320 KB, five times the broker's limit
    await fill(memory.store, history)
    pages = await memory.pages()
    assert len(pages) >= 5
    assert all(page.ByteSize() <= LIMIT for page in pages)
    assert joined(pages) == history


async def test_one_message_larger_than_a_page_is_split_and_joined(memory: Memory) -> None:
    big = "".join(f"{i:07d}😀" for i in range(20_000))  # 220 KB with 4-byte characters
    await fill(memory.store, [("user", "hi"), ("assistant", big), ("user", "thanks")])
    pages = await memory.pages()
    assert sum(1 for page in pages for m in page.messages if m.partial) >= 3
    assert joined(pages) == [("user", "hi"), ("assistant", big), ("user", "thanks")]


async def test_a_small_history_is_one_page_as_before(memory: Memory) -> None:
    await fill(memory.store, [("user", "hi"), ("assistant", "hello")])
    (page,) = await memory.pages()
    assert [(m.role, m.content, m.partial) for m in page.messages] == [
        ("user", "hi", False),
        ("assistant", "hello", False),
    ]
    assert page.next_page_token == ""
    empty = await memory.ask(
        "history.load", LoadHistoryRequest(agent="chat", conversation_id="none"), LoadHistoryResponse
    )
    assert list(empty.messages) == []


async def test_a_history_that_changes_between_pages_is_refused_not_stitched(memory: Memory) -> None:
    await fill(memory.store, [("user", "x" * 40_000), ("assistant", "y" * 40_000)])
    first = await memory.ask(
        "history.load", LoadHistoryRequest(agent="chat", conversation_id="c1"), LoadHistoryResponse
    )
    assert first.next_page_token
    await fill(memory.store, [("user", "other")])
    with pytest.raises(RemoteError) as refused:
        await memory.ask(
            "history.load",
            LoadHistoryRequest(agent="chat", conversation_id="c1", page_token=first.next_page_token),
            LoadHistoryResponse,
        )
    assert refused.value.code == "memory.history_changed"
    assert refused.value.retryable


@pytest.mark.parametrize("token", ["garbage", "1:2", "-1:0:1-1-1", "1:-5:1-1-1", "9" * 5000 + ":0:x", "a:b:c"])
async def test_a_malformed_page_token_is_a_bad_request(memory: Memory, token: str) -> None:
    await fill(memory.store, [("user", "hi")])
    with pytest.raises(RemoteError) as refused:
        await memory.ask(
            "history.load",
            LoadHistoryRequest(agent="chat", conversation_id="c1", page_token=token),
            LoadHistoryResponse,
        )
    assert refused.value.code in {"memory.bad_request", "memory.history_changed"}


async def test_store_pages_refuse_a_page_too_small_to_progress(tmp_path: Path) -> None:
    async with MemoryStore.open(tmp_path / "m.db") as store:
        with pytest.raises(ValueError, match="at least"):
            await store.history_page("chat", "c1", "", max_bytes=10)
        await fill(store, [("user", "a" * 1000)])
        page = await store.history_page("chat", "c1", "", max_bytes=300)
        await store.append_turn("chat", "c1", Message("user", "more"), None, strategy="sliding-window", max_messages=20)
        with pytest.raises(HistoryChangedError):
            await store.history_page("chat", "c1", page.next_token, max_bytes=300)


async def test_replacing_with_a_digest_guard_needs_no_base_in_the_request(memory: Memory) -> None:
    history = [("user", "u" * 30_000), ("assistant", "a" * 30_000), ("user", "u2"), ("assistant", "a2")]
    await fill(memory.store, history)
    base = [Message(r, c) for r, c in history[:2]]
    request = ReplaceHistoryRequest(agent="chat", conversation_id="c1", base_count=2, base_sha256=history_digest(base))
    request.messages.add(role="system", content="summary")
    assert request.ByteSize() < 1000  # the base itself would not fit in one message
    reply = await memory.ask("history.replace", request, ReplaceHistoryResponse)
    assert reply.replaced
    assert [(m.role, m.content) for m in await memory.store.load_history("chat", "c1")] == [
        ("system", "summary"),
        ("user", "u2"),
        ("assistant", "a2"),
    ]
    stale = ReplaceHistoryRequest(agent="chat", conversation_id="c1", base_count=2, base_sha256=history_digest(base))
    stale.messages.add(role="system", content="again")
    assert not (await memory.ask("history.replace", stale, ReplaceHistoryResponse)).replaced
    negative = ReplaceHistoryRequest(agent="chat", conversation_id="c1", base_count=-1, base_sha256="x")
    with pytest.raises(RemoteError, match="negative"):
        await memory.ask("history.replace", negative, ReplaceHistoryResponse)


# -- files ------------------------------------------------------------------------------------------


async def test_read_file_pages_a_file_larger_than_one_reply(memory: Memory) -> None:
    content = "".join(f"row {i:05d} é\n" for i in range(12_000))  # ~160 KB
    memory.write("big.txt", content)
    pieces: list[str] = []
    offset = 0
    while True:
        result = await memory.tool("read_file", {"path": "big.txt", "offset": offset})
        assert not result.is_error
        assert result.ByteSize() <= LIMIT - ENVELOPE_ROOM  # dispatch can pass it on unchanged
        text = result.content
        marker = text.rfind("\n…[truncated: big.txt is ")
        if marker < 0:
            pieces.append(text)
            break
        pieces.append(text[:marker])
        assert f"is {len(content)} characters; this shows characters {offset} to " in text
        offset = int(text.rsplit("offset=", 1)[1].split(" ")[0])
    assert "".join(pieces) == content


@pytest.mark.parametrize(
    ("offset", "error"),
    [
        (-1, "'offset' must be a non-negative whole number of characters"),
        ("9" * 5000, "'offset' must be a non-negative whole number of characters"),
        (True, "'offset' must be a non-negative whole number of characters"),
        ([1], "'offset' must be a non-negative whole number of characters"),
        (10**9, "offset 1000000000 is past the end of a.txt (5 characters)"),
    ],
)
async def test_read_file_offsets_are_checked(memory: Memory, offset: object, error: str) -> None:
    await memory.tool("write_file", {"path": "a.txt", "content": "hello"})
    result = await memory.tool("read_file", {"path": "a.txt", "offset": offset})
    assert result.is_error
    assert result.content == f"Error: {error}"
    assert (await memory.tool("read_file", {"path": "a.txt", "offset": "2"})).content == "llo"


async def test_a_tool_output_too_large_for_one_reply_is_cut_with_a_marker(memory: Memory) -> None:
    for i in range(40):
        memory.write(f"f{i}.txt", ("needle " + "n" * 480 + "\n") * 10)
    result = await memory.tool("grep", {"pattern": "needle"})
    assert result.truncated
    assert result.ByteSize() <= LIMIT - ENVELOPE_ROOM
    assert "…[truncated: the output is " in result.content


async def test_admin_listing_and_reads_come_in_pages(memory: Memory) -> None:
    for i in range(200):
        memory.write(f"{'d' * 200}/{i:03d}-{'n' * 200}.txt", "x")
    entries: list[str] = []
    offset = 0
    while True:
        page = await memory.ask(
            "files.list", ListFilesRequest(workspace=SCOPE, path="d" * 200, offset=offset), ListFilesResponse
        )
        entries += [e.path for e in page.entries]
        if not page.next_offset:
            break
        assert page.next_offset > offset
        offset = page.next_offset
    assert len(entries) == 200
    assert len(set(entries)) == 200

    content = "z" * 100_000
    memory.write("z.txt", content)
    read = ""
    offset = 0
    while True:
        reply = await memory.ask(
            "files.read", ReadFileRequest(workspace=SCOPE, path="z.txt", offset=offset), ReadFileResponse
        )
        assert reply.length == len(content)
        read += reply.content
        if not reply.next_offset:
            break
        offset = reply.next_offset
    assert read == content
    for bad in (-1, 100_001):
        with pytest.raises(RemoteError) as refused:
            await memory.ask("files.read", ReadFileRequest(workspace=SCOPE, path="z.txt", offset=bad), ReadFileResponse)
        assert refused.value.code == "memory.bad_request"
    with pytest.raises(RemoteError):
        await memory.ask("files.list", ListFilesRequest(workspace=SCOPE, offset=-3), ListFilesResponse)


# -- facts ------------------------------------------------------------------------------------------


async def test_facts_are_screened_in_requests_that_fit_and_recalled_within_one_reply(memory: Memory) -> None:
    facts = [f"fact {i:03d} " + "f" * 980 for i in range(100)]  # ~100 KB in all
    first = await memory.ask("facts.save", SaveFactsRequest(user_id="ada", facts=facts[:60]), SaveFactsResponse)
    assert first.stored == 60
    assert len(memory.screen.requests) == 2  # 60 KB: more than one screen request may carry
    assert all(r.ByteSize() <= LIMIT - ENVELOPE_ROOM for r in memory.screen.requests)
    assert [f for r in memory.screen.requests for f in r.facts] == facts[:60]  # screened as stored
    rest = await memory.ask("facts.save", SaveFactsRequest(user_id="ada", facts=facts[60:]), SaveFactsResponse)
    assert rest.stored == 40
    recalled = await memory.ask("facts.get", GetFactsRequest(user_id="ada", max_facts=100), GetFactsResponse)
    assert recalled.truncated
    assert 0 < len(recalled.facts) < 100
    assert list(recalled.facts) == facts[-len(recalled.facts) :]  # the newest, oldest first
    few = await memory.ask("facts.get", GetFactsRequest(user_id="ada", max_facts=3), GetFactsResponse)
    assert not few.truncated
    assert list(few.facts) == facts[-3:]
