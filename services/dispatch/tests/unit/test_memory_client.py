"""Dispatch's memory client: histories read in pages, turns and facts sized for one message."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from atmosphere.bus import JetStreamLayout, MessageContext, Router, ServiceError, subjects
from atmosphere.bus.errors import HistoryUnavailableError
from atmosphere.bus.sizes import ENVELOPE_ROOM, utf8_len
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.memory.v1.memory_pb2 import (
    AppendTurnRequest,
    AppendTurnResponse,
    ChatMessage,
    Compaction,
    LoadHistoryRequest,
    LoadHistoryResponse,
    ReplaceHistoryRequest,
    ReplaceHistoryResponse,
    SaveFactsRequest,
    SaveFactsResponse,
)
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, RunSubmission
from atmosphere.dispatch.conversation import ConversationMemory
from atmosphere.dispatch.handlers import RunExecutor
from atmosphere.dispatch.harness import AgentHarness, HarnessConfig
from atmosphere.dispatch.memory_client import (
    HISTORY_ATTEMPTS,
    MAX_STORED_MESSAGE_BYTES,
    TRUNCATION_MARKER,
    MemoryClient,
)
from atmosphere.dispatch.model_side import ModelSide
from atmosphere.dispatch.runtime.openai import BuiltInAgentRuntime
from atmosphere.sdk import App, agent
from atmosphere.sdk import ChatMessage as SdkMessage
from atmosphere.sdk.runtime import RuntimeConfig
from atmosphere.testing import ScriptedModel

from .conftest import Policy, governance_router

LIMIT = 64 * 1024


class ChangedError(ServiceError):
    code = "memory.history_changed"
    retryable = True


@dataclass
class Pager:
    """Serves a scripted sequence of history pages, and records what else it is asked."""

    pages: list[LoadHistoryResponse] = field(default_factory=list)
    changes: int = 0
    """How many first requests answer `memory.history_changed` on their second page."""
    loads: list[LoadHistoryRequest] = field(default_factory=list)
    appends: list[AppendTurnRequest] = field(default_factory=list)
    saves: list[SaveFactsRequest] = field(default_factory=list)

    def router(self) -> Router:
        router = Router()

        async def load(request: LoadHistoryRequest, _ctx: MessageContext) -> LoadHistoryResponse:
            self.loads.append(request)
            index = int(request.page_token or "0")
            if index == 1 and self.changes:
                self.changes -= 1
                raise ChangedError("the history changed")
            return self.pages[index]

        async def append(request: AppendTurnRequest, _ctx: MessageContext) -> AppendTurnResponse:
            self.appends.append(request)
            return AppendTurnResponse(stored_messages=2)

        async def replace(request: ReplaceHistoryRequest, _ctx: MessageContext) -> ReplaceHistoryResponse:
            return ReplaceHistoryResponse(replaced=True)

        async def save(request: SaveFactsRequest, _ctx: MessageContext) -> SaveFactsResponse:
            self.saves.append(request)
            return SaveFactsResponse(stored=len(request.facts))

        router.add(subjects.memory("history.load"), LoadHistoryRequest, load)
        router.add(subjects.memory("history.append"), AppendTurnRequest, append)
        router.add(subjects.memory("history.replace"), ReplaceHistoryRequest, replace)
        router.add(subjects.memory("facts.save"), SaveFactsRequest, save)
        return router


@pytest.fixture
async def pager() -> AsyncIterator[tuple[Pager, MemoryClient]]:
    bus = FakeBus(max_payload=LIMIT)
    state = Pager()
    async with bus.serve(state.router()):
        yield state, MemoryClient(bus, timeout=1)


def page(*messages: tuple[str, str, bool], next_token: str = "") -> LoadHistoryResponse:
    return LoadHistoryResponse(
        messages=[ChatMessage(role=r, content=c, partial=p) for r, c, p in messages], next_page_token=next_token
    )


async def test_pages_are_read_and_split_messages_joined(pager: tuple[Pager, MemoryClient]) -> None:
    state, client = pager
    state.pages = [
        page(("user", "hello", False), ("assistant", "part one, ", True), next_token="1"),
        page(("assistant", "part two, ", True), next_token="2"),
        page(("assistant", "the end", False), ("user", "thanks", False)),
    ]
    history = await client.load_history("chat", "c1")
    assert history == [
        SdkMessage("user", "hello"),
        SdkMessage("assistant", "part one, part two, the end"),
        SdkMessage("user", "thanks"),
    ]
    assert [r.page_token for r in state.loads] == ["", "1", "2"]


async def test_a_history_that_changed_while_read_is_read_again(pager: tuple[Pager, MemoryClient]) -> None:
    state, client = pager
    state.pages = [page(("user", "a", False), next_token="1"), page(("assistant", "b", False))]
    state.changes = HISTORY_ATTEMPTS - 1
    assert await client.load_history("chat", "c1") == [SdkMessage("user", "a"), SdkMessage("assistant", "b")]
    state.changes = HISTORY_ATTEMPTS
    with pytest.raises(HistoryUnavailableError, match=r"memory answered memory\.history_changed"):
        await client.load_history("chat", "c1")


async def test_a_page_token_that_does_not_move_is_refused(pager: tuple[Pager, MemoryClient]) -> None:
    state, client = pager
    state.pages = [page(("user", "a", False), next_token="0")]
    with pytest.raises(HistoryUnavailableError, match="the same history page twice"):
        await client.load_history("chat", "c1")


async def test_a_huge_turn_is_cut_to_what_memory_keeps_with_its_marker(pager: tuple[Pager, MemoryClient]) -> None:
    state, client = pager
    await client.append_turn(
        agent="chat",
        conversation_id="c1",
        run_id="r1",
        user="u" * (10 * 1024 * 1024),
        assistant="a" * 100,
        compaction=Compaction(),
    )
    (append,) = state.appends
    limit = min(MAX_STORED_MESSAGE_BYTES, (LIMIT - ENVELOPE_ROOM) // 2)
    assert utf8_len(append.user.content) == limit
    assert append.user.content.endswith(TRUNCATION_MARKER)
    assert append.assistant.content == "a" * 100


async def test_a_replacement_too_large_to_send_leaves_the_history_alone(pager: tuple[Pager, MemoryClient]) -> None:
    _, client = pager
    huge = [SdkMessage("system", "s" * LIMIT)]
    assert await client.replace_history("chat", "c1", huge) is False
    assert await client.replace_history("chat", "c1", [SdkMessage("system", "summary")], base=huge) is True


async def test_facts_go_in_as_many_requests_as_they_need(pager: tuple[Pager, MemoryClient]) -> None:
    state, client = pager
    facts = [f"fact {i} " + "f" * 990 for i in range(100)]
    stored = await client.save_facts(user_id="ada", facts=facts, agent="chat", conversation_id="c1")
    assert stored == 100
    assert len(state.saves) >= 3
    assert all(s.ByteSize() <= LIMIT - ENVELOPE_ROOM for s in state.saves)
    assert [f for s in state.saves for f in s.facts] == facts


@agent(name="chat", system_prompt="Remember.")
class Chat:
    """Answers with the model."""


async def test_a_run_whose_history_cannot_be_loaded_ends_with_a_clear_error(fake_provider: ScriptedModel) -> None:
    bus = FakeBus()  # no memory service answers
    await bus.provision(JetStreamLayout())
    runtime = BuiltInAgentRuntime(RuntimeConfig(base_url=fake_provider.base_url, model="fake-model"))
    try:
        conversation = ConversationMemory(MemoryClient(bus, timeout=0.2), HarnessConfig(), runtime)
        harness = AgentHarness(conversation_memory=True)
        executor = RunExecutor(App(agents=[Chat]), bus, ModelSide(runtime, conversation), harnesses={"chat": harness})
        async with bus.serve(governance_router(Policy())):
            await executor.execute(RunSubmission(run_id="r1", session_id="s", conversation_id="c1", agent="chat"))
    finally:
        await runtime.aclose()
    events = [RunEvent.FromString(data) for _, data in bus.stream_messages(subjects.EVENTS_STREAM)]
    terminal = events[-1]
    assert terminal.error.code == "memory.history_unavailable"
    assert "no memory service is running" in terminal.error.message
    assert fake_provider.requests == []  # the model was never asked as if the conversation were new
