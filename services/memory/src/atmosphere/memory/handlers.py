"""Memory's responders: conversation history, long-term facts, the plan and file tools, admin reads.

Blocking disk work (plans, files) runs in threads; the stores bound and validate everything
they are given, and a tool failure is an `Error: ...` (or `write_todos failed: ...`) result
for the model, never an exception on the bus.

Every answer fits in one bus message (`max_payload`, budgets from `atmosphere.bus.sizes`): a
history is read in pages (`page_token`), file listings and admin reads too (`offset`), the facts
recalled are the newest that fit, and a tool's text that would not fit is cut with a marker
saying so. Facts are sent to governance's screen in requests that fit, never as one that cannot
be sent.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf.message import Message as ProtoMessage

from atmosphere.bus import MessageContext, Router, subjects
from atmosphere.bus.errors import HistoryChangedError
from atmosphere.bus.sizes import DEFAULT_MAX_PAYLOAD, REPLY_ROOM, clip, data_budget, head, reply_budget, utf8_len
from atmosphere.contracts.governance.v1.governance_pb2 import ScreenFactsRequest, ScreenFactsResponse
from atmosphere.contracts.memory.v1.memory_pb2 import (
    AppendTurnRequest,
    AppendTurnResponse,
    ChatMessage,
    DropWorkspaceRequest,
    DropWorkspaceResponse,
    FileEntry,
    GetFactsRequest,
    GetFactsResponse,
    GetPlanRequest,
    GetPlanResponse,
    ListFilesRequest,
    ListFilesResponse,
    LoadHistoryRequest,
    LoadHistoryResponse,
    MemoryWrite,
    ReadFileRequest,
    ReadFileResponse,
    ReplaceHistoryRequest,
    ReplaceHistoryResponse,
    SaveFactsRequest,
    SaveFactsResponse,
)
from atmosphere.contracts.run.v1.run_pb2 import PlanStep, PlanUpdate, RunEvent
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolReply
from atmosphere.memory.errors import MemoryBadRequestError, MemoryNotFoundError
from atmosphere.memory.plans import AgentPlan, PlanError, run_write_todos
from atmosphere.memory.store import MemoryStore, StalePageTokenError, bound_fact
from atmosphere.memory.vfs import MissingFileError, WorkspaceError, run_file_tool
from atmosphere.memory.workspaces import Workspaces
from atmosphere.sdk import ChatMessage as Message
from atmosphere.sdk import ToolKind
from atmosphere.sdk.builtin_tools import FILE_TOOL_NAMES, FILE_TOOLS, WRITE_TODOS
from atmosphere.sdk.compaction import parse_strategy

log = logging.getLogger("atmosphere.memory")

ScreenFacts = Callable[[ScreenFactsRequest], Awaitable[ScreenFactsResponse]]
WriteThrough = Callable[[MemoryWrite, str], Awaitable[Any]]
"""Store a write where every replica applies it, and return this replica's answer to it; the
second argument is its idempotency key ("" for none): a retried write with the same key is
stored once."""
MAX_FACTS = 100
WRITING_TOOLS = frozenset({WRITE_TODOS.name} | {t.name for t in FILE_TOOLS if t.kind is not ToolKind.READ})
"""The harness tools that change a workspace: they go through the write log; the rest only read."""


_ENTRY_OVERHEAD = 24
"""Protobuf framing of one `FileEntry` or fact in a reply (tags, lengths, the size varint)."""


def runtime_info(workspaces: Workspaces | None = None) -> dict[str, Any]:
    """Memory's runtime-truth fragment: what it serves now."""
    if workspaces is None:
        return {}
    return {
        "memory": {
            "conversationStore": "sqlite",
            "longTermStore": "sqlite",
            "workspaceRoot": str(workspaces.root),
            "tools": [WRITE_TODOS.name, *sorted(FILE_TOOL_NAMES)],
        }
    }


def _from_wire(messages: Any) -> list[Message]:
    try:
        return [Message(m.role, m.content) for m in messages]
    except ValueError as exc:
        raise MemoryBadRequestError(str(exc)) from exc


def _digest(message: ProtoMessage) -> str:
    """What identifies a request sent again: its exact content."""
    return hashlib.sha256(message.SerializeToString(deterministic=True)).hexdigest()


def plan_update(plan: AgentPlan, *, conversation_id: str, agent_id: str) -> PlanUpdate:
    """A plan as the `plan-update` event carries it."""
    update = PlanUpdate(
        steps=[PlanStep(content=s.content, status=s.status.value, active_form=s.active_form) for s in plan.steps],
        conversation_id=conversation_id,
        agent_id=agent_id,
    )
    if plan.goal is not None:
        update.goal = plan.goal
    return update


class MemoryHandlers:
    """Every `atmo.mem.*` responder."""

    def __init__(
        self,
        store: MemoryStore,
        workspaces: Workspaces,
        screen: ScreenFacts,
        *,
        recent_window: int = 6,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        write: WriteThrough | None = None,
        caught_up: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Serve history and facts from `store`, plans and files from `workspaces`; `screen` asks governance.

        `max_payload` is the broker's message limit: every answer is sized to fit in it.
        With several memory replicas, `write` stores each write on `ATMO_MEMORY` (every replica
        applies it through `apply`) and `caught_up` holds each read until this replica applied
        every write stored before it (`atmosphere.service.replica`); alone, writes apply here.
        """
        self._store = store
        self._workspaces = workspaces
        self._screen = screen
        self._recent_window = recent_window
        self._reply_bytes = reply_budget(max_payload)
        self._tool_bytes = data_budget(max_payload)
        self._write: WriteThrough = write or (lambda change, _key: self.apply(0, change))
        self._caught_up = caught_up

    async def _read(self) -> None:
        """Before a read: wait until this replica applied every write acknowledged so far."""
        if self._caught_up is not None:
            await self._caught_up()

    async def apply(self, seq: int, change: MemoryWrite) -> Any:
        """Apply write `seq` of the log to this replica's store: the same write gives every replica the same state.

        Applying a write again (a redelivery after a crash) changes nothing: a turn carries its
        `seq` into the store; the other writes leave the same state when repeated.
        """
        op = change.WhichOneof("op")
        if op == "append_turn":
            return await self._append_turn(change.append_turn, seq)
        if op == "replace_history":
            return await self._replace_history(change.replace_history)
        if op == "store_facts":
            facts = list(change.store_facts.facts)
            return await self._store.save_facts(change.store_facts.user_id, facts) if facts else 0
        if op == "drop_workspace":
            return await self._drop_workspace(change.drop_workspace)
        if op == "tool":
            return await self._tool(change.tool)
        raise MemoryBadRequestError(f"not a memory write: {op}")

    # -- conversation history ------------------------------------------------------------------

    async def load_history(self, request: LoadHistoryRequest, _ctx: MessageContext) -> LoadHistoryResponse:
        """`atmo.mem.history.load`: one page of the history (`next_page_token` says if more follow)."""
        await self._read()
        try:
            page = await self._store.history_page(
                request.agent, request.conversation_id, request.page_token, max_bytes=self._reply_bytes
            )
        except StalePageTokenError as exc:
            # Retryable: the same read, started again from the first page, succeeds.
            raise HistoryChangedError(str(exc), retryable=True) from exc
        except ValueError as exc:
            raise MemoryBadRequestError(str(exc)) from exc
        return LoadHistoryResponse(
            messages=[ChatMessage(role=m.role, content=m.content, partial=m.partial) for m in page.messages],
            next_page_token=page.next_token,
        )

    async def append_turn(self, request: AppendTurnRequest, _ctx: MessageContext) -> AppendTurnResponse:
        """`atmo.mem.history.append`: the user turn, and the answer unless the run failed."""
        # The caller retries an append that timed out with the same bytes: stored once. The key
        # is the run and the request's content, so two different turns of one run both count.
        key = f"turn:{request.run_id}:{_digest(request)}" if request.run_id else ""
        result: AppendTurnResponse = await self._write(MemoryWrite(append_turn=request), key)
        return result

    async def _append_turn(self, request: AppendTurnRequest, seq: int) -> AppendTurnResponse:
        compaction = request.compaction
        try:
            stored = await self._store.append_turn(
                request.agent,
                request.conversation_id,
                Message("user", request.user.content),
                Message("assistant", request.assistant.content) if request.HasField("assistant") else None,
                strategy=parse_strategy(compaction.strategy),
                max_messages=max(2, compaction.max_messages or 20),
                model=compaction.model or None,
                recent_window=self._recent_window,
                log_seq=seq,
            )
        except ValueError as exc:
            raise MemoryBadRequestError(str(exc)) from exc
        return AppendTurnResponse(stored_messages=stored)

    async def replace_history(self, request: ReplaceHistoryRequest, _ctx: MessageContext) -> ReplaceHistoryResponse:
        """`atmo.mem.history.replace`: a summarized history, staged turns, or empty to clear."""
        result: ReplaceHistoryResponse = await self._write(MemoryWrite(replace_history=request), "")
        return result

    async def _replace_history(self, request: ReplaceHistoryRequest) -> ReplaceHistoryResponse:
        base = _from_wire(request.base.messages) if request.HasField("base") else None
        digest = (request.base_count, request.base_sha256) if request.base_sha256 else None
        if request.base_count < 0:
            raise MemoryBadRequestError(f"base_count must not be negative, got {request.base_count}")
        messages = _from_wire(request.messages)
        try:
            if not messages and base is None and digest is None:
                await self._store.clear_history(request.agent, request.conversation_id)
                return ReplaceHistoryResponse(stored_messages=0, replaced=True)
            replaced = await self._store.replace_history(
                request.agent, request.conversation_id, messages, base=base, base_digest=digest
            )
        except ValueError as exc:
            raise MemoryBadRequestError(str(exc)) from exc
        return ReplaceHistoryResponse(stored_messages=len(messages) if replaced else 0, replaced=replaced)

    # -- long-term facts -----------------------------------------------------------------------

    async def save_facts(self, request: SaveFactsRequest, _ctx: MessageContext) -> SaveFactsResponse:
        """`atmo.mem.facts.save`: every fact is screened by governance first; no answer stores none.

        Facts are bounded as the store keeps them BEFORE the screen (what is screened is what is
        stored), and screened in requests that fit in one bus message.
        """
        facts = [fact for fact in (bound_fact(f) for f in request.facts[:MAX_FACTS]) if fact]
        if not request.user_id.strip():
            raise MemoryBadRequestError("facts need a user id")
        keep: list[str] = []
        flagged = 0
        for batch in self._screen_batches(facts, request):
            try:
                screened = await self._screen(batch)
            except Exception as exc:  # any failure of the screen: fail-closed
                log.warning("the fact screen did not answer (%s): %d fact(s) not stored", exc, len(batch.facts))
                continue
            keep += [s.text for s in screened.facts[: len(batch.facts)] if s.store and s.text.strip()]
            flagged += sum(1 for s in screened.facts[: len(batch.facts)] if s.store and s.verdict != "SAFE")
        # Screened once, here; what passed is stored as one write that every replica applies.
        stored = await self._write(MemoryWrite(store_facts=SaveFactsRequest(user_id=request.user_id, facts=keep)), "")
        return SaveFactsResponse(stored=stored, dropped=len(facts) - len(keep), flagged=flagged)

    def _screen_batches(self, facts: list[str], request: SaveFactsRequest) -> list[ScreenFactsRequest]:
        """`facts` as screen requests that each fit in one bus message."""
        batches: list[ScreenFactsRequest] = []
        batch = ScreenFactsRequest(user_id=request.user_id, conversation_id=request.conversation_id)
        for fact in facts:
            cost = utf8_len(fact) + _ENTRY_OVERHEAD
            if batch.facts and batch.ByteSize() + cost > self._tool_bytes:
                batches.append(batch)
                batch = ScreenFactsRequest(user_id=request.user_id, conversation_id=request.conversation_id)
            batch.facts.append(fact)
        if batch.facts:
            batches.append(batch)
        return batches

    async def get_facts(self, request: GetFactsRequest, _ctx: MessageContext) -> GetFactsResponse:
        """`atmo.mem.facts.get`: the newest facts that fit in one reply, oldest first."""
        if not request.user_id.strip():
            return GetFactsResponse()
        await self._read()
        facts = await self._store.get_facts(request.user_id, request.max_facts or 20)
        room = self._reply_bytes
        kept = 0
        for fact in reversed(facts):  # the newest matter most: they are kept first
            room -= utf8_len(fact) + _ENTRY_OVERHEAD
            if room < 0:
                break
            kept += 1
        if kept < len(facts):
            left_out = len(facts) - kept
            log.warning("facts of %s: the %d oldest of %d left out of one reply", request.user_id, left_out, len(facts))
        return GetFactsResponse(facts=facts[len(facts) - kept :], truncated=kept < len(facts))

    # -- the harness tools ---------------------------------------------------------------------

    async def tool(self, call: ToolCall, _ctx: MessageContext) -> ToolReply:
        """`atmo.mem.tool.<name>`: `write_todos` and the eight file tools, answered within one message."""
        if call.name in WRITING_TOOLS:
            # A call sent again (the same bytes) is applied once; call ids come from the model and
            # may repeat within a run, so the content is part of the key.
            key = f"tool:{call.run_id}:{_digest(call)}" if call.run_id else ""
            result: ToolReply = await self._write(MemoryWrite(tool=call), key)
        else:
            await self._read()
            result = await self._tool(call)
        return self._fitting(result)

    def _fitting(self, result: ToolReply) -> ToolReply:
        """`result` cut to fit in one bus message with room for dispatch's run event around it."""
        if result.ByteSize() <= self._tool_bytes:
            return result
        if result.events and sum(e.ByteSize() for e in result.events) > self._tool_bytes // 2:
            # A plan too large to stream; it is stored all the same, and the model is told.
            del result.events[:]
            result.content += "\n(The plan-update event was too large to send; the plan is stored.)"
        # The rest of the result, plus the `truncated` flag and a longer length prefix at most.
        room = self._tool_bytes - (result.ByteSize() - utf8_len(result.content)) - 8
        if utf8_len(result.content) > room:
            result.content = clip(result.content, room, "the output")
            result.truncated = True
        return result

    async def _tool(self, call: ToolCall) -> ToolReply:
        try:
            arguments = json.loads(call.arguments_json or "{}")
        except (ValueError, RecursionError):  # not JSON, nested too deep, or a number too long
            arguments = None
        if not isinstance(arguments, dict):
            return ToolReply(call_id=call.call_id, content="Error: the arguments are not a JSON object", is_error=True)
        if not call.HasField("workspace"):
            if call.name == WRITE_TODOS.name:
                return ToolReply(
                    call_id=call.call_id, content="write_todos unavailable: no plan store is bound to this session."
                )
            return ToolReply(
                call_id=call.call_id, content="File tools unavailable: no agent filesystem is bound to this session."
            )
        if call.name == WRITE_TODOS.name:
            return await self._write_todos(call, arguments)
        if call.name in FILE_TOOL_NAMES:
            return await asyncio.to_thread(self._file_tool, call, arguments)
        return ToolReply(call_id=call.call_id, content=f"Error: memory serves no tool named {call.name}", is_error=True)

    async def _write_todos(self, call: ToolCall, arguments: dict[str, Any]) -> ToolReply:
        scope = call.workspace
        try:
            store = self._workspaces.plans(scope)
        except WorkspaceError as exc:
            return ToolReply(call_id=call.call_id, content=f"write_todos failed: {exc}", is_error=True)
        agent_id = scope.agent_id or call.agent or "default"
        conversation = scope.conversation_id or "default"
        text, plan = await asyncio.to_thread(run_write_todos, store, agent_id, conversation, arguments)
        # A refused plan is a failed call (a `tool-error` frame), as a refused file operation is.
        result = ToolReply(call_id=call.call_id, content=text, is_error=plan is None)
        if plan is not None:
            result.events.append(
                RunEvent(plan_update=plan_update(plan, conversation_id=conversation, agent_id=agent_id))
            )
        return result

    def _file_tool(self, call: ToolCall, arguments: dict[str, Any]) -> ToolReply:
        try:
            files = self._workspaces.files(call.workspace)
        except WorkspaceError as exc:
            return ToolReply(call_id=call.call_id, content=f"Error: {exc}", is_error=True)
        # The page of a read leaves room for the rest of the reply, so its own marker survives.
        text = run_file_tool(files, call.name, arguments, max_bytes=self._tool_bytes - REPLY_ROOM)
        return ToolReply(call_id=call.call_id, content=text, is_error=text.startswith("Error: "))

    # -- workspaces ----------------------------------------------------------------------------

    async def drop_workspace(self, request: DropWorkspaceRequest, _ctx: MessageContext) -> DropWorkspaceResponse:
        """`atmo.mem.workspace.drop`: an ephemeral workspace, or one conversation's plans and files."""
        result: DropWorkspaceResponse = await self._write(MemoryWrite(drop_workspace=request), "")
        return result

    async def _drop_workspace(self, request: DropWorkspaceRequest) -> DropWorkspaceResponse:
        try:
            existed = await asyncio.to_thread(
                self._workspaces.drop, request.workspace, conversation_only=request.conversation_only
            )
        except WorkspaceError as exc:
            raise MemoryBadRequestError(str(exc)) from exc
        return DropWorkspaceResponse(existed=existed)

    async def get_plan(self, request: GetPlanRequest, _ctx: MessageContext) -> GetPlanResponse:
        """`atmo.mem.plan.get` (admin)."""
        await self._read()
        scope = request.workspace
        try:
            store = self._workspaces.plans(scope)
            plan = await asyncio.to_thread(store.get, scope.agent_id, scope.conversation_id)
        except (WorkspaceError, PlanError, ValueError) as exc:  # PlanError: a traversal-shaped plan key
            raise MemoryBadRequestError(str(exc)) from exc
        if plan is None:
            return GetPlanResponse(found=False)
        update = plan_update(plan, conversation_id=scope.conversation_id, agent_id=scope.agent_id)
        return GetPlanResponse(found=True, plan=update)

    async def list_files(self, request: ListFilesRequest, _ctx: MessageContext) -> ListFilesResponse:
        """`atmo.mem.files.list` (admin): the entries from `offset` that fit in one reply."""
        await self._read()
        if request.offset < 0:
            raise MemoryBadRequestError(f"offset must not be negative, got {request.offset}")

        def listing() -> ListFilesResponse:
            files = self._workspaces.files(request.workspace)
            directory = None if request.path in {"", "."} else request.path
            return self._listing_page(files.ls(directory), request.offset)

        try:
            return await asyncio.to_thread(listing)
        except WorkspaceError as exc:
            raise MemoryBadRequestError(str(exc)) from exc

    def _listing_page(self, entries: list[Any], offset: int) -> ListFilesResponse:
        """The entries from `offset` that fit in one reply; `next_offset` when more follow."""
        response = ListFilesResponse()
        room = self._reply_bytes
        for index in range(offset, len(entries)):
            entry = entries[index]
            room -= utf8_len(entry.path) + _ENTRY_OVERHEAD
            if room < 0:
                response.next_offset = index
                break
            response.entries.append(FileEntry(path=entry.path, size=entry.size, directory=entry.directory))
        return response

    async def read_file(self, request: ReadFileRequest, _ctx: MessageContext) -> ReadFileResponse:
        """`atmo.mem.files.read` (admin): the content from `offset` that fits in one reply."""
        await self._read()
        if request.offset < 0:
            raise MemoryBadRequestError(f"offset must not be negative, got {request.offset}")

        def reading() -> ReadFileResponse:
            content = self._workspaces.files(request.workspace).read(request.path)
            if request.offset > len(content):
                msg = f"offset {request.offset} is past the end of {request.path} ({len(content)} characters)"
                raise MemoryBadRequestError(msg)
            piece = head(content[request.offset :], self._reply_bytes)
            end = request.offset + len(piece)
            return ReadFileResponse(content=piece, length=len(content), next_offset=end if end < len(content) else 0)

        try:
            return await asyncio.to_thread(reading)
        except MissingFileError as exc:
            raise MemoryNotFoundError(str(exc)) from exc
        except WorkspaceError as exc:
            raise MemoryBadRequestError(str(exc)) from exc

    def router(self) -> Router:
        """Memory's subjects."""
        router = Router()
        router.add(subjects.memory("history.load"), LoadHistoryRequest, self.load_history)
        router.add(subjects.memory("history.append"), AppendTurnRequest, self.append_turn)
        router.add(subjects.memory("history.replace"), ReplaceHistoryRequest, self.replace_history)
        router.add(subjects.memory("facts.save"), SaveFactsRequest, self.save_facts)
        router.add(subjects.memory("facts.get"), GetFactsRequest, self.get_facts)
        router.add(subjects.memory("workspace.drop"), DropWorkspaceRequest, self.drop_workspace)
        router.add(subjects.memory("plan.get"), GetPlanRequest, self.get_plan)
        router.add(subjects.memory("files.list"), ListFilesRequest, self.list_files)
        router.add(subjects.memory("files.read"), ReadFileRequest, self.read_file)
        router.add(subjects.memory_tools_all(), ToolCall, self.tool)
        return router
