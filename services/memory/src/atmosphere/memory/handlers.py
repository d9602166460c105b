"""Memory's responders: conversation history, long-term facts, the plan and file tools, admin reads.

Blocking disk work (plans, files) runs in threads; the stores bound and validate everything
they are given, and a tool failure is an `Error: ...` (or `write_todos failed: ...`) result
for the model, never an exception on the bus.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from atmosphere.bus import MessageContext, Router, ServiceError, subjects
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
    ReadFileRequest,
    ReadFileResponse,
    ReplaceHistoryRequest,
    ReplaceHistoryResponse,
    SaveFactsRequest,
    SaveFactsResponse,
)
from atmosphere.contracts.run.v1.run_pb2 import PlanStep, PlanUpdate, RunEvent
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolResult
from atmosphere.memory.file_tools import run_file_tool
from atmosphere.memory.filesystem import WorkspaceError
from atmosphere.memory.plans import AgentPlan, PlanError, run_write_todos
from atmosphere.memory.store import MemoryStore
from atmosphere.memory.workspaces import Workspaces
from atmosphere.sdk.builtin_tools import FILE_TOOL_NAMES, WRITE_TODOS
from atmosphere.sdk.compaction import Message, parse_strategy

log = logging.getLogger("atmosphere.memory")

ScreenFacts = Callable[[ScreenFactsRequest], Awaitable[ScreenFactsResponse]]
MAX_FACTS = 100


class BadRequestError(ServiceError):
    """A malformed id, scope or path."""

    code = "memory.bad_request"


class NotFoundError(ServiceError):
    """No such plan, file or directory."""

    code = "memory.not_found"


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


def _messages(messages: list[Message]) -> list[ChatMessage]:
    return [ChatMessage(role=m.role, content=m.content) for m in messages]


def _from_wire(messages: Any) -> list[Message]:
    try:
        return [Message(m.role, m.content) for m in messages]
    except ValueError as exc:
        raise BadRequestError(str(exc)) from exc


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
        self, store: MemoryStore, workspaces: Workspaces, screen: ScreenFacts, *, recent_window: int = 6
    ) -> None:
        """Serve history and facts from `store`, plans and files from `workspaces`; `screen` asks governance."""
        self._store = store
        self._workspaces = workspaces
        self._screen = screen
        self._recent_window = recent_window

    # -- conversation history ------------------------------------------------------------------

    async def load_history(self, request: LoadHistoryRequest, _ctx: MessageContext) -> LoadHistoryResponse:
        """`atmo.mem.history.load`."""
        try:
            messages = await self._store.load_history(request.agent, request.conversation_id)
        except ValueError as exc:
            raise BadRequestError(str(exc)) from exc
        return LoadHistoryResponse(messages=_messages(messages))

    async def append_turn(self, request: AppendTurnRequest, _ctx: MessageContext) -> AppendTurnResponse:
        """`atmo.mem.history.append`: the user turn, and the answer unless the run failed."""
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
            )
        except ValueError as exc:
            raise BadRequestError(str(exc)) from exc
        return AppendTurnResponse(stored_messages=stored)

    async def replace_history(self, request: ReplaceHistoryRequest, _ctx: MessageContext) -> ReplaceHistoryResponse:
        """`atmo.mem.history.replace`: a summarized history, staged turns, or empty to clear."""
        base = _from_wire(request.base.messages) if request.HasField("base") else None
        messages = _from_wire(request.messages)
        try:
            if not messages and base is None:
                await self._store.clear_history(request.agent, request.conversation_id)
                return ReplaceHistoryResponse(stored_messages=0, replaced=True)
            replaced = await self._store.replace_history(request.agent, request.conversation_id, messages, base=base)
        except ValueError as exc:
            raise BadRequestError(str(exc)) from exc
        return ReplaceHistoryResponse(stored_messages=len(messages) if replaced else 0, replaced=replaced)

    # -- long-term facts -----------------------------------------------------------------------

    async def save_facts(self, request: SaveFactsRequest, _ctx: MessageContext) -> SaveFactsResponse:
        """`atmo.mem.facts.save`: every fact is screened by governance first; no answer stores none."""
        facts = [f for f in request.facts[:MAX_FACTS] if f.strip()]
        if not request.user_id.strip():
            raise BadRequestError("facts need a user id")
        if not facts:
            return SaveFactsResponse()
        try:
            screened = await self._screen(
                ScreenFactsRequest(facts=facts, user_id=request.user_id, conversation_id=request.conversation_id)
            )
        except Exception as exc:  # any failure of the screen: fail-closed
            log.warning("the fact screen did not answer (%s): %d fact(s) not stored", exc, len(facts))
            return SaveFactsResponse(dropped=len(facts))
        keep = [s.text for s in screened.facts if s.store and s.text.strip()]
        flagged = sum(1 for s in screened.facts if s.store and s.verdict != "SAFE")
        dropped = len(facts) - len(keep)
        stored = await self._store.save_facts(request.user_id, keep) if keep else 0
        return SaveFactsResponse(stored=stored, dropped=dropped, flagged=flagged)

    async def get_facts(self, request: GetFactsRequest, _ctx: MessageContext) -> GetFactsResponse:
        """`atmo.mem.facts.get`: the newest facts, oldest first."""
        if not request.user_id.strip():
            return GetFactsResponse()
        facts = await self._store.get_facts(request.user_id, request.max_facts or 20)
        return GetFactsResponse(facts=facts)

    # -- the harness tools ---------------------------------------------------------------------

    async def tool(self, call: ToolCall, _ctx: MessageContext) -> ToolResult:
        """`atmo.mem.tool.<name>`: `write_todos` and the eight file tools."""
        try:
            arguments = json.loads(call.arguments_json or "{}")
        except json.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            return ToolResult(call_id=call.call_id, content="Error: the arguments are not a JSON object", is_error=True)
        if not call.HasField("workspace"):
            if call.name == WRITE_TODOS.name:
                return ToolResult(
                    call_id=call.call_id, content="write_todos unavailable: no plan store is bound to this session."
                )
            return ToolResult(
                call_id=call.call_id, content="File tools unavailable: no agent filesystem is bound to this session."
            )
        if call.name == WRITE_TODOS.name:
            return await self._write_todos(call, arguments)
        if call.name in FILE_TOOL_NAMES:
            return await asyncio.to_thread(self._file_tool, call, arguments)
        return ToolResult(
            call_id=call.call_id, content=f"Error: memory serves no tool named {call.name}", is_error=True
        )

    async def _write_todos(self, call: ToolCall, arguments: dict[str, Any]) -> ToolResult:
        scope = call.workspace
        try:
            store = self._workspaces.plans(scope)
        except WorkspaceError as exc:
            return ToolResult(call_id=call.call_id, content=f"write_todos failed: {exc}")
        agent_id = scope.agent_id or call.agent or "default"
        conversation = scope.conversation_id or "default"
        text, plan = await asyncio.to_thread(run_write_todos, store, agent_id, conversation, arguments)
        result = ToolResult(call_id=call.call_id, content=text)
        if plan is not None:
            result.events.append(
                RunEvent(plan_update=plan_update(plan, conversation_id=conversation, agent_id=agent_id))
            )
        return result

    def _file_tool(self, call: ToolCall, arguments: dict[str, Any]) -> ToolResult:
        try:
            files = self._workspaces.files(call.workspace)
        except WorkspaceError as exc:
            return ToolResult(call_id=call.call_id, content=f"Error: {exc}", is_error=True)
        text = run_file_tool(files, call.name, arguments)
        return ToolResult(call_id=call.call_id, content=text, is_error=text.startswith("Error: "))

    # -- workspaces ----------------------------------------------------------------------------

    async def drop_workspace(self, request: DropWorkspaceRequest, _ctx: MessageContext) -> DropWorkspaceResponse:
        """`atmo.mem.workspace.drop`: an ephemeral workspace, or one conversation's plans and files."""
        try:
            existed = await asyncio.to_thread(
                self._workspaces.drop, request.workspace, conversation_only=request.conversation_only
            )
        except WorkspaceError as exc:
            raise BadRequestError(str(exc)) from exc
        return DropWorkspaceResponse(existed=existed)

    async def get_plan(self, request: GetPlanRequest, _ctx: MessageContext) -> GetPlanResponse:
        """`atmo.mem.plan.get` (admin)."""
        scope = request.workspace
        try:
            store = self._workspaces.plans(scope)
            plan = await asyncio.to_thread(store.get, scope.agent_id, scope.conversation_id)
        except (WorkspaceError, PlanError, ValueError) as exc:  # PlanError: a traversal-shaped plan key
            raise BadRequestError(str(exc)) from exc
        if plan is None:
            return GetPlanResponse(found=False)
        update = plan_update(plan, conversation_id=scope.conversation_id, agent_id=scope.agent_id)
        return GetPlanResponse(found=True, plan=update)

    async def list_files(self, request: ListFilesRequest, _ctx: MessageContext) -> ListFilesResponse:
        """`atmo.mem.files.list` (admin)."""

        def listing() -> ListFilesResponse:
            files = self._workspaces.files(request.workspace)
            directory = None if request.path in {"", "."} else request.path
            entries = files.ls(directory)
            return ListFilesResponse(
                entries=[FileEntry(path=e.path, size=e.size, directory=e.directory) for e in entries]
            )

        try:
            return await asyncio.to_thread(listing)
        except WorkspaceError as exc:
            raise BadRequestError(str(exc)) from exc

    async def read_file(self, request: ReadFileRequest, _ctx: MessageContext) -> ReadFileResponse:
        """`atmo.mem.files.read` (admin)."""

        def reading() -> ReadFileResponse:
            return ReadFileResponse(content=self._workspaces.files(request.workspace).read(request.path))

        try:
            return await asyncio.to_thread(reading)
        except WorkspaceError as exc:
            if str(exc).startswith("File not found"):
                raise NotFoundError(str(exc)) from exc
            raise BadRequestError(str(exc)) from exc

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
