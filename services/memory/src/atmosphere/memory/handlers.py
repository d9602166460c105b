"""Memory's responders: conversation history, long-term facts, the plan and file tools, admin reads.

Each area has its own responders (`responders/`); this routes memory's subjects to them. What
changes memory goes through the journal (`replication.py`): with several replicas each write is
stored on `ATMO_MEMORY` and applied by every replica, and each read first waits until this
replica applied every write acknowledged before it; alone, writes apply here at once.

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

from typing import Any

from atmosphere.bus import MessageContext, Router, subjects
from atmosphere.bus.sizes import DEFAULT_MAX_PAYLOAD
from atmosphere.contracts.memory.v1.memory_pb2 import (
    AppendTurnRequest,
    AppendTurnResponse,
    DropWorkspaceRequest,
    DropWorkspaceResponse,
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
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolReply
from atmosphere.memory.replication import MemoryJournal, MemoryReplica
from atmosphere.memory.responders.facts import FactResponders, ScreenFacts
from atmosphere.memory.responders.history import HistoryResponders
from atmosphere.memory.responders.tools import ToolResponders
from atmosphere.memory.responders.workspaces import WorkspaceResponders
from atmosphere.memory.store import MemoryStore
from atmosphere.memory.workspaces import Workspaces
from atmosphere.sdk.builtin_tools import FILE_TOOL_NAMES, WRITE_TODOS


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
        journal: MemoryJournal | None = None,
    ) -> None:
        """Serve history and facts from `store`, plans and files from `workspaces`; `screen` asks governance.

        `max_payload` is the broker's message limit: every answer is sized to fit in it.
        `journal` puts every write on memory's write log, where every replica applies it to its
        own store and workspaces; without one (a single memory) each write applies here at once,
        compacting with `recent_window`.
        """
        self._journal = journal or MemoryJournal(
            MemoryReplica(store, workspaces, recent_window=recent_window, max_payload=max_payload)
        )
        self._history = HistoryResponders(store, self._journal, max_payload=max_payload)
        self._facts = FactResponders(store, screen, self._journal, max_payload=max_payload)
        self._tools = ToolResponders(self._journal, max_payload=max_payload)
        self._workspaces = WorkspaceResponders(workspaces, self._journal, max_payload=max_payload)

    async def apply(self, seq: int, change: MemoryWrite) -> Any:
        """Apply write `seq` of the log to this replica (`MemoryReplica.apply`)."""
        return await self._journal.replica.apply(seq, change)

    async def load_history(self, request: LoadHistoryRequest, ctx: MessageContext) -> LoadHistoryResponse:
        """`atmo.mem.history.load` (`HistoryResponders`)."""
        return await self._history.load_history(request, ctx)

    async def append_turn(self, request: AppendTurnRequest, ctx: MessageContext) -> AppendTurnResponse:
        """`atmo.mem.history.append` (`HistoryResponders`)."""
        return await self._history.append_turn(request, ctx)

    async def replace_history(self, request: ReplaceHistoryRequest, ctx: MessageContext) -> ReplaceHistoryResponse:
        """`atmo.mem.history.replace` (`HistoryResponders`)."""
        return await self._history.replace_history(request, ctx)

    async def save_facts(self, request: SaveFactsRequest, ctx: MessageContext) -> SaveFactsResponse:
        """`atmo.mem.facts.save` (`FactResponders`)."""
        return await self._facts.save_facts(request, ctx)

    async def get_facts(self, request: GetFactsRequest, ctx: MessageContext) -> GetFactsResponse:
        """`atmo.mem.facts.get` (`FactResponders`)."""
        return await self._facts.get_facts(request, ctx)

    async def tool(self, call: ToolCall, ctx: MessageContext) -> ToolReply:
        """`atmo.mem.tool.<name>` (`ToolResponders`)."""
        return await self._tools.tool(call, ctx)

    async def drop_workspace(self, request: DropWorkspaceRequest, ctx: MessageContext) -> DropWorkspaceResponse:
        """`atmo.mem.workspace.drop` (`WorkspaceResponders`)."""
        return await self._workspaces.drop_workspace(request, ctx)

    async def get_plan(self, request: GetPlanRequest, ctx: MessageContext) -> GetPlanResponse:
        """`atmo.mem.plan.get` (`WorkspaceResponders`)."""
        return await self._workspaces.get_plan(request, ctx)

    async def list_files(self, request: ListFilesRequest, ctx: MessageContext) -> ListFilesResponse:
        """`atmo.mem.files.list` (`WorkspaceResponders`)."""
        return await self._workspaces.list_files(request, ctx)

    async def read_file(self, request: ReadFileRequest, ctx: MessageContext) -> ReadFileResponse:
        """`atmo.mem.files.read` (`WorkspaceResponders`)."""
        return await self._workspaces.read_file(request, ctx)

    def router(self) -> Router:
        """Memory's subjects."""
        router = Router()
        router.add(subjects.memory("history.load"), LoadHistoryRequest, self._history.load_history)
        router.add(subjects.memory("history.append"), AppendTurnRequest, self._history.append_turn)
        router.add(subjects.memory("history.replace"), ReplaceHistoryRequest, self._history.replace_history)
        router.add(subjects.memory("facts.save"), SaveFactsRequest, self._facts.save_facts)
        router.add(subjects.memory("facts.get"), GetFactsRequest, self._facts.get_facts)
        router.add(subjects.memory("workspace.drop"), DropWorkspaceRequest, self._workspaces.drop_workspace)
        router.add(subjects.memory("plan.get"), GetPlanRequest, self._workspaces.get_plan)
        router.add(subjects.memory("files.list"), ListFilesRequest, self._workspaces.list_files)
        router.add(subjects.memory("files.read"), ReadFileRequest, self._workspaces.read_file)
        router.add(subjects.memory_tools_all(), ToolCall, self._tools.tool)
        return router
