"""The memory side of a run: facts parsing and recall, history staging, summarizing, extraction."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from google.protobuf.message import Message as ProtoMessage

from atmosphere.bus import MessageContext, Router, subjects
from atmosphere.bus.errors import HistoryUnavailableError
from atmosphere.bus.runs import CONTEXT_METADATA_KEY, HISTORY_METADATA_KEY
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.memory.v1.memory_pb2 import (
    AppendTurnRequest,
    AppendTurnResponse,
    ConversationClosed,
    GetFactsRequest,
    GetFactsResponse,
    LoadHistoryRequest,
    LoadHistoryResponse,
    ReplaceHistoryRequest,
    ReplaceHistoryResponse,
    SaveFactsRequest,
    SaveFactsResponse,
)
from atmosphere.contracts.memory.v1.memory_pb2 import ChatMessage as WireMessage
from atmosphere.contracts.run.v1.run_pb2 import RunSubmission
from atmosphere.dispatch.client_turns import NO_CLIENT_TURNS, ClientTurns, client_turns_of
from atmosphere.dispatch.conversation import (
    EXTRACTION_SYSTEM_PROMPT,
    ConversationMemory,
    FactExtractor,
    model_text,
    parse_facts,
    user_id_of,
    with_facts,
)
from atmosphere.dispatch.harness import AgentHarness, HarnessConfig
from atmosphere.dispatch.memory_client import MemoryClient
from atmosphere.sdk import AiRequest, App, ChatMessage, StreamingSession
from atmosphere.sdk.compaction import SUMMARY_SYSTEM_PROMPT, history_digest
from atmosphere.sdk.host import AiCapability
from atmosphere.sdk.runtime import AgentExecutionContext, AgentRuntime, RuntimeConfig

Key = tuple[str, str]


# -- a scripted model and a fake memory service ----------------------------------------------------


class ScriptedRuntime(AgentRuntime):
    """Answers every call with `answer` (streamed in small chunks); None answers with an error."""

    name = "scripted"

    def __init__(self, answer: str | None = "", *, delay: float = 0.0, raises: Exception | None = None) -> None:
        super().__init__(RuntimeConfig(model="scripted-model"))
        self.answer = answer
        self.delay = delay
        self.raises = raises
        self.calls: list[AgentExecutionContext] = []

    def is_available(self) -> bool:
        return True

    def capabilities(self) -> frozenset[AiCapability]:
        return frozenset({AiCapability.TEXT_STREAMING})

    async def execute(self, ctx: AgentExecutionContext, session: StreamingSession) -> None:
        self.calls.append(ctx)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.raises is not None:
            raise self.raises
        if self.answer is None:
            await session.error("the model is down")
            return
        for start in range(0, len(self.answer), 7):
            await session.send(self.answer[start : start + 7])
        await session.complete()


@dataclass
class FakeMemory:
    """`atmo.mem.*` history and facts, kept in dicts; every request is recorded."""

    histories: dict[Key, list[tuple[str, str]]] = field(default_factory=dict)
    facts: dict[str, list[str]] = field(default_factory=dict)
    requests: list[tuple[str, ProtoMessage]] = field(default_factory=list)

    def ops(self) -> list[str]:
        return [op for op, _ in self.requests]

    def of(self, op: str) -> list[ProtoMessage]:
        return [request for name, request in self.requests if name == op]

    def router(self) -> Router:
        router = Router()

        async def load(request: LoadHistoryRequest, _ctx: MessageContext) -> LoadHistoryResponse:
            self.requests.append(("history.load", request))
            stored = self.histories.get((request.agent, request.conversation_id), [])
            return LoadHistoryResponse(messages=[WireMessage(role=r, content=c) for r, c in stored])

        async def append(request: AppendTurnRequest, _ctx: MessageContext) -> AppendTurnResponse:
            self.requests.append(("history.append", request))
            stored = self.histories.setdefault((request.agent, request.conversation_id), [])
            stored.append(("user", request.user.content))
            if request.HasField("assistant"):
                stored.append(("assistant", request.assistant.content))
            return AppendTurnResponse(stored_messages=len(stored))

        async def replace(request: ReplaceHistoryRequest, _ctx: MessageContext) -> ReplaceHistoryResponse:
            self.requests.append(("history.replace", request))
            key = (request.agent, request.conversation_id)
            current = self.histories.get(key, [])
            messages = [(m.role, m.content) for m in request.messages]
            if request.HasField("base"):
                base = [(m.role, m.content) for m in request.base.messages]
                if current[: len(base)] != base:
                    return ReplaceHistoryResponse(replaced=False)
                messages += current[len(base) :]
            elif request.base_sha256:
                head = [WireMessage(role=r, content=c) for r, c in current[: request.base_count]]
                if len(head) < request.base_count or history_digest(head) != request.base_sha256:
                    return ReplaceHistoryResponse(replaced=False)
                messages += current[request.base_count :]
            self.histories[key] = messages
            return ReplaceHistoryResponse(stored_messages=len(messages), replaced=True)

        async def get_facts(request: GetFactsRequest, _ctx: MessageContext) -> GetFactsResponse:
            self.requests.append(("facts.get", request))
            return GetFactsResponse(facts=self.facts.get(request.user_id, [])[-request.max_facts :])

        async def save_facts(request: SaveFactsRequest, _ctx: MessageContext) -> SaveFactsResponse:
            self.requests.append(("facts.save", request))
            self.facts.setdefault(request.user_id, []).extend(request.facts)
            return SaveFactsResponse(stored=len(request.facts))

        router.add(subjects.memory("history.load"), LoadHistoryRequest, load)
        router.add(subjects.memory("history.append"), AppendTurnRequest, append)
        router.add(subjects.memory("history.replace"), ReplaceHistoryRequest, replace)
        router.add(subjects.memory("facts.get"), GetFactsRequest, get_facts)
        router.add(subjects.memory("facts.save"), SaveFactsRequest, save_facts)
        return router


@dataclass
class Memory:
    store: FakeMemory
    client: MemoryClient


@pytest.fixture
async def memory() -> AsyncIterator[Memory]:
    bus = FakeBus()
    store = FakeMemory()
    async with bus.serve(store.router()):
        yield Memory(store, MemoryClient(bus, timeout=1))


def run(
    *, agent: str = "chat", conversation_id: str = "c1", user: str | None = "ada", **metadata: str
) -> RunSubmission:
    request = RunSubmission(run_id="r1", session_id="s1", conversation_id=conversation_id, agent=agent, message="hi")
    if user is not None:
        request.principal.CopyFrom(Principal(user_id=user))
    request.metadata.update(metadata)
    return request


MEMORY_ON = AgentHarness(conversation_memory=True, long_term_memory=True, max_history_messages=4)


# -- parse_facts, with_facts, user_id_of -----------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "facts"),
    [
        (
            '["The user\'s name is Ada", "The user prefers Python"]',
            ["The user's name is Ada", "The user prefers Python"],
        ),
        ('```json\n["Ada lives in London"]\n```', ["Ada lives in London"]),
        ('```\n[\n  "a",\n  "b"\n]\n```', ["a", "b"]),
        (
            'Sure! Here are the facts:\n["likes tea", "owns a cat"]\nLet me know if you need more.',
            ["likes tea", "owns a cat"],
        ),
        ('["She said \\"hi\\" to me", "path C:\\\\x"]', ['She said "hi" to me', "path C:\\x"]),
        ('["caf\\u00e9 owner"]', ["café owner"]),
        ('["a]b", "c"]', ["a]b", "c"]),
        ('["  padded  ", "", "   "]', ["padded"]),
        ('["bad \\q escape", "good"]', ["good"]),
        ("[]", []),
        ("", []),
        ("no facts here", []),
        ("] backwards [", []),
        ("[1, 2, 3]", []),
    ],
)
def test_parse_facts(answer: str, facts: list[str]) -> None:
    assert parse_facts(answer) == facts


def test_with_facts_appends_after_a_blank_line() -> None:
    assert with_facts("You are helpful.", ["a", "b"]) == ("You are helpful.\n\nKnown facts about this user:\n- a\n- b")
    assert with_facts("", ["a", "b"]) == "Known facts about this user:\n- a\n- b"
    assert with_facts("You are helpful.", []) == "You are helpful."


@pytest.mark.parametrize(
    ("principal", "user"),
    [
        (None, ""),
        (Principal(), ""),
        (Principal(user_id="anonymous"), ""),
        (Principal(user_id="Anonymous"), ""),
        (Principal(user_id="  "), ""),
        (Principal(user_id="ada"), "ada"),
    ],
)
def test_user_id_of(principal: Principal | None, user: str) -> None:
    request = RunSubmission(run_id="r")
    closed = ConversationClosed(conversation_id="c")
    if principal is not None:
        request.principal.CopyFrom(principal)
        closed.principal.CopyFrom(principal)
    assert user_id_of(request) == user
    assert user_id_of(closed) == user


# -- history: load, record, the client's turns-------------------------------------------------------------


async def test_history_is_loaded_and_the_turn_recorded(memory: Memory) -> None:
    memory.store.histories[("chat", "c1")] = [("user", "earlier"), ("assistant", "reply")]
    conv = ConversationMemory(memory.client, HarnessConfig(compaction="token-window"), ScriptedRuntime())
    history = await conv.history(run(), MEMORY_ON, NO_CLIENT_TURNS)
    assert history == (ChatMessage("user", "earlier"), ChatMessage("assistant", "reply"))
    await conv.record(run(), MEMORY_ON, user="hi", answer="hello", model="gpt-4o", client_kept=False)
    (append,) = memory.store.of("history.append")
    assert isinstance(append, AppendTurnRequest)
    assert (append.agent, append.conversation_id, append.run_id) == ("chat", "c1", "r1")
    assert (append.user.role, append.user.content) == ("user", "hi")
    assert (append.assistant.role, append.assistant.content) == ("assistant", "hello")
    assert (append.compaction.strategy, append.compaction.max_messages, append.compaction.model) == (
        "token-window",
        4,
        "gpt-4o",
    )


async def test_a_failed_run_records_only_the_user_message(memory: Memory) -> None:
    conv = ConversationMemory(memory.client, HarnessConfig(), None)
    await conv.record(run(), MEMORY_ON, user="hi", answer=None, model=None, client_kept=False)
    (append,) = memory.store.of("history.append")
    assert isinstance(append, AppendTurnRequest)
    assert not append.HasField("assistant")
    assert memory.store.histories[("chat", "c1")] == [("user", "hi")]


async def test_without_conversation_memory_nothing_reaches_memory(memory: Memory) -> None:
    conv = ConversationMemory(memory.client, HarnessConfig(), ScriptedRuntime())
    client = ClientTurns((ChatMessage("user", "from the client"),))
    assert await conv.history(run(), AgentHarness(), client) == client.turns
    await conv.record(run(), AgentHarness(), user="hi", answer="ok", model=None, client_kept=False)
    assert await conv.recall(run(), AgentHarness(), AiRequest(message="hi")) == AiRequest(message="hi")
    assert memory.store.requests == []


CLIENT_TURNS = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "what is 2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "tool", "content": "ignored"},
    "garbage",
]


@pytest.mark.parametrize("turns", [CLIENT_TURNS, []], ids=["prior-turns", "first-message"])
async def test_a_conversation_the_client_keeps_never_reaches_memory(memory: Memory, turns: list[object]) -> None:
    # The Chat Completions door: its turns are the whole history, under a key made for one request.
    request = run(conversation_id="openai:req-42", **{HISTORY_METADATA_KEY: json.dumps(turns)})
    client = client_turns_of(request)
    assert client.keeps_conversation
    assert [m.role for m in client.turns] == ["system", "user", "assistant"][: len(turns)]
    memory.store.histories[("chat", "openai:req-42")] = [("user", "never read")]
    conv = ConversationMemory(memory.client, HarnessConfig(), ScriptedRuntime())
    assert await conv.history(request, MEMORY_ON, client) == client.turns
    await conv.record(request, MEMORY_ON, user="and 3+3?", answer="6", model=None, client_kept=True)
    assert memory.store.requests == []  # no load, no append: nothing is left behind under the key


async def test_the_responses_context_follows_the_stored_conversation_which_records_the_turn(memory: Memory) -> None:
    # The Responses API: memory keeps the conversation, instructions and earlier items are this run's.
    memory.store.histories[("chat", "c1")] = [("user", "My name is Ada."), ("assistant", "Hi Ada.")]
    request = run(**{CONTEXT_METADATA_KEY: json.dumps([{"role": "system", "content": "Answer in French."}])})
    client = client_turns_of(request)
    assert not client.keeps_conversation
    conv = ConversationMemory(memory.client, HarnessConfig(), ScriptedRuntime())
    assert await conv.history(request, MEMORY_ON, client) == (
        ChatMessage("user", "My name is Ada."),
        ChatMessage("assistant", "Hi Ada."),
        ChatMessage("system", "Answer in French."),
    )
    await conv.record(request, MEMORY_ON, user="Who am I?", answer="Ada.", model=None, client_kept=False)
    assert memory.store.ops() == ["history.load", "history.append"]
    assert memory.store.histories[("chat", "c1")][-2:] == [("user", "Who am I?"), ("assistant", "Ada.")]


async def test_a_summarizing_agent_summarizes_a_long_client_history_without_storing_it(memory: Memory) -> None:
    runtime = ScriptedRuntime("Ada asked about u1 and u2.")
    conv = ConversationMemory(memory.client, SUMMARIZING, runtime)
    client = ClientTurns(tuple(ChatMessage(r, c) for r, c in SIX), keeps_conversation=True)
    history = await conv.history(run(), MEMORY_ON, client)
    assert history[0] == ChatMessage(
        "system", "[Conversation summary of 4 earlier messages]\nAda asked about u1 and u2."
    )
    assert history[1:] == (ChatMessage("user", "u3"), ChatMessage("assistant", "a3"))
    assert memory.store.requests == []


async def test_when_memory_does_not_answer_a_client_kept_history_is_used_as_sent() -> None:
    conv = ConversationMemory(MemoryClient(FakeBus(), timeout=0.1), HarnessConfig(), None)
    client = ClientTurns((ChatMessage("user", "prior"),), keeps_conversation=True)
    assert await conv.history(run(), MEMORY_ON, client) == client.turns


async def test_a_responses_context_does_not_hide_a_history_that_cannot_be_loaded() -> None:
    conv = ConversationMemory(MemoryClient(FakeBus(), timeout=0.1), HarnessConfig(), None)
    with pytest.raises(HistoryUnavailableError):
        await conv.history(run(), MEMORY_ON, ClientTurns((ChatMessage("system", "be brief"),)))


async def test_a_history_that_cannot_be_loaded_fails_instead_of_being_forgotten() -> None:
    conv = ConversationMemory(MemoryClient(FakeBus(), timeout=0.1), HarnessConfig(), None)
    with pytest.raises(HistoryUnavailableError, match="no memory service is running") as failure:
        await conv.history(run(), MEMORY_ON, NO_CLIENT_TURNS)
    assert failure.value.code == "memory.history_unavailable"


# -- summarizing compaction ------------------------------------------------------------------------

SIX = [("user", "u1"), ("assistant", "a1"), ("user", "u2"), ("assistant", "a2"), ("user", "u3"), ("assistant", "a3")]
SUMMARIZING = HarnessConfig(compaction="summarizing", recent_window=2)


async def test_summarizing_asks_the_runtime_and_stores_a_guarded_replacement(memory: Memory) -> None:
    memory.store.histories[("chat", "c1")] = list(SIX)
    runtime = ScriptedRuntime("  Ada asked about u1 and u2.  ")
    conv = ConversationMemory(memory.client, SUMMARIZING, runtime)
    history = await conv.history(run(), MEMORY_ON, NO_CLIENT_TURNS)
    expected = (
        ChatMessage("system", "[Conversation summary of 4 earlier messages]\nAda asked about u1 and u2."),
        ChatMessage("user", "u3"),
        ChatMessage("assistant", "a3"),
    )
    assert history == expected
    (ctx,) = runtime.calls
    assert ctx.request.system_prompt == SUMMARY_SYSTEM_PROMPT
    assert ctx.tools == ()
    assert "user: u1" in ctx.request.message
    assert "assistant: a2" in ctx.request.message
    assert "u3" not in ctx.request.message  # the recent window is kept verbatim, not summarized
    (replace,) = memory.store.of("history.replace")
    assert isinstance(replace, ReplaceHistoryRequest)
    # The base travels as a digest (a history can be larger than one bus message).
    assert replace.base_count == len(SIX)
    assert replace.base_sha256 == history_digest([WireMessage(role=r, content=c) for r, c in SIX])
    assert not replace.HasField("base")
    assert [(m.role, m.content) for m in replace.messages] == [(m.role, m.content) for m in expected]
    assert memory.store.histories[("chat", "c1")] == [(m.role, m.content) for m in expected]


@pytest.mark.parametrize(
    "runtime",
    [
        None,
        ScriptedRuntime(None),
        ScriptedRuntime("   "),
        ScriptedRuntime(raises=RuntimeError("provider exploded")),
    ],
    ids=["no-runtime", "model-error", "blank-answer", "runtime-raises"],
)
async def test_summarizing_falls_back_to_the_local_summary(memory: Memory, runtime: ScriptedRuntime | None) -> None:
    memory.store.histories[("chat", "c1")] = list(SIX)
    history = await ConversationMemory(memory.client, SUMMARIZING, runtime).history(run(), MEMORY_ON, NO_CLIENT_TURNS)
    assert len(history) == 3
    summary = history[0]
    assert summary.role == "system"
    assert summary.content.startswith("[Conversation summary of 4 earlier messages]\n")
    assert "user: u1" in summary.content
    assert "assistant: a2" in summary.content
    assert history[1:] == (ChatMessage("user", "u3"), ChatMessage("assistant", "a3"))
    assert len(memory.store.of("history.replace")) == 1


async def test_a_summary_slower_than_the_model_call_timeout_falls_back_to_the_local_one(memory: Memory) -> None:
    memory.store.histories[("chat", "c1")] = list(SIX)
    slow = ScriptedRuntime("too late", delay=1.0)
    conv = ConversationMemory(memory.client, SUMMARIZING, slow, model_call_timeout=0.05)
    history = await conv.history(run(), MEMORY_ON, NO_CLIENT_TURNS)
    assert history[0].content.startswith("[Conversation summary of 4 earlier messages]\nuser: u1")
    assert "too late" not in history[0].content


async def test_a_history_within_bounds_is_not_summarized(memory: Memory) -> None:
    memory.store.histories[("chat", "c1")] = SIX[:4]
    runtime = ScriptedRuntime("never")
    history = await ConversationMemory(memory.client, SUMMARIZING, runtime).history(run(), MEMORY_ON, NO_CLIENT_TURNS)
    assert len(history) == 4
    assert runtime.calls == []
    assert memory.store.of("history.replace") == []


async def test_a_slow_model_call_gives_up() -> None:
    slow = ScriptedRuntime("late", delay=1.0)
    assert await model_text(slow, agent="chat", system_prompt="s", prompt="p", timeout=0.05) is None
    on_time = ScriptedRuntime("on time")
    assert await model_text(on_time, agent="chat", system_prompt="s", prompt="p", timeout=0.5) == "on time"
    assert await model_text(None, agent="chat", system_prompt="s", prompt="p") is None


# -- long-term memory: recall ----------------------------------------------------------------------


async def test_recall_appends_the_users_facts_to_the_system_prompt(memory: Memory) -> None:
    memory.store.facts["ada"] = ["The user's name is Ada", "The user prefers Python"]
    conv = ConversationMemory(memory.client, HarnessConfig(), None)
    request = AiRequest(message="hi", system_prompt="You are helpful.")
    recalled = await conv.recall(run(), MEMORY_ON, request)
    assert recalled.system_prompt == (
        "You are helpful.\n\nKnown facts about this user:\n- The user's name is Ada\n- The user prefers Python"
    )
    assert recalled.message == "hi"
    (get,) = memory.store.of("facts.get")
    assert isinstance(get, GetFactsRequest)
    assert (get.user_id, get.max_facts) == ("ada", 20)


async def test_recall_skips_anonymous_users_and_agents_without_long_term_memory(memory: Memory) -> None:
    memory.store.facts["ada"] = ["fact"]
    conv = ConversationMemory(memory.client, HarnessConfig(), None)
    request = AiRequest(message="hi", system_prompt="sys")
    assert await conv.recall(run(user=None), MEMORY_ON, request) == request
    assert await conv.recall(run(user="anonymous"), MEMORY_ON, request) == request
    assert await conv.recall(run(), AgentHarness(conversation_memory=True), request) == request
    assert memory.store.requests == []
    assert await conv.recall(run(user="bob"), MEMORY_ON, request) == request  # no facts known


# -- long-term memory: extraction when a conversation closes ---------------------------------------

HARNESSES = {
    "chat": AgentHarness(conversation_memory=True, long_term_memory=True),
    "plain": AgentHarness(conversation_memory=True),
}
TRANSCRIPT = [
    ("system", "[Conversation summary of 2 earlier messages]\nsecret system text"),
    ("user", "Hi, I'm Ada and I write Python."),
    ("assistant", "Nice to meet you, Ada!"),
]


def closed(agent: str = "chat", user: str | None = "ada") -> ConversationClosed:
    message = ConversationClosed(agent=agent, conversation_id="c1", reason="disconnect")
    if user is not None:
        message.principal.CopyFrom(Principal(user_id=user))
    return message


async def test_extraction_saves_the_parsed_facts(memory: Memory) -> None:
    memory.store.histories[("chat", "c1")] = list(TRANSCRIPT)
    runtime = ScriptedRuntime('```json\n["The user\'s name is Ada", "The user writes Python"]\n```')
    extractor = FactExtractor(App([]), HARNESSES, memory.client, runtime)
    assert await extractor.on_closed(closed()) == 2
    (save,) = memory.store.of("facts.save")
    assert isinstance(save, SaveFactsRequest)
    assert list(save.facts) == ["The user's name is Ada", "The user writes Python"]
    assert (save.user_id, save.agent, save.conversation_id) == ("ada", "chat", "c1")
    (ctx,) = runtime.calls
    assert ctx.request.system_prompt == EXTRACTION_SYSTEM_PROMPT
    assert ctx.request.message.endswith("user: Hi, I'm Ada and I write Python.\nassistant: Nice to meet you, Ada!")
    assert "secret system text" not in ctx.request.message
    assert "JSON array" in ctx.request.message
    assert ctx.tools == ()


@pytest.mark.parametrize(
    "message",
    [closed(user=None), closed(user="anonymous"), closed(agent="plain"), closed(agent="unknown")],
    ids=["no-user", "anonymous", "no-long-term-memory", "unknown-agent"],
)
async def test_extraction_does_nothing_without_a_user_or_long_term_memory(
    memory: Memory, message: ConversationClosed
) -> None:
    for agent in ("chat", "plain", "unknown"):
        memory.store.histories[(agent, "c1")] = list(TRANSCRIPT)
    runtime = ScriptedRuntime('["fact"]')
    assert await FactExtractor(App([]), HARNESSES, memory.client, runtime).on_closed(message) == 0
    assert memory.store.requests == []
    assert runtime.calls == []


async def test_extraction_without_a_runtime_history_or_facts_stores_nothing(memory: Memory) -> None:
    assert await FactExtractor(App([]), HARNESSES, memory.client, None).on_closed(closed()) == 0
    assert memory.store.requests == []
    # No history: the model is not asked.
    runtime = ScriptedRuntime('["fact"]')
    assert await FactExtractor(App([]), HARNESSES, memory.client, runtime).on_closed(closed()) == 0
    assert runtime.calls == []
    # The model finds nothing (or fails): nothing is saved.
    memory.store.histories[("chat", "c1")] = list(TRANSCRIPT)
    for answer in ("[]", "I could not find any facts.", None):
        assert await FactExtractor(App([]), HARNESSES, memory.client, ScriptedRuntime(answer)).on_closed(closed()) == 0
    assert memory.store.of("facts.save") == []
