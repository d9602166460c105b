"""`atmo.mem.workspace.drop` and the admin reads of a workspace: its plan, its files, a file's content."""

from __future__ import annotations

import asyncio
from typing import Any

from atmosphere.bus import MessageContext
from atmosphere.bus.sizes import DEFAULT_MAX_PAYLOAD, head, reply_budget, utf8_len
from atmosphere.contracts.memory.v1.memory_pb2 import (
    DropWorkspaceRequest,
    DropWorkspaceResponse,
    FileEntry,
    GetPlanRequest,
    GetPlanResponse,
    ListFilesRequest,
    ListFilesResponse,
    MemoryWrite,
    ReadFileRequest,
    ReadFileResponse,
)
from atmosphere.memory.errors import MemoryBadRequestError, MemoryNotFoundError
from atmosphere.memory.plans import PlanError
from atmosphere.memory.replication import MemoryJournal
from atmosphere.memory.responders.sizing import ENTRY_OVERHEAD
from atmosphere.memory.tool_runner import plan_update
from atmosphere.memory.vfs import MissingFileError, WorkspaceError
from atmosphere.memory.workspaces import Workspaces


class WorkspaceResponders:
    """Drops a workspace through the journal; reads a plan, a listing or a file from this replica, in pages."""

    def __init__(
        self, workspaces: Workspaces, journal: MemoryJournal, *, max_payload: int = DEFAULT_MAX_PAYLOAD
    ) -> None:
        """Read `workspaces`, write through `journal`; every answer fits in one message of `max_payload` bytes."""
        self._workspaces = workspaces
        self._journal = journal
        self._reply_bytes = reply_budget(max_payload)

    async def drop_workspace(self, request: DropWorkspaceRequest, _ctx: MessageContext) -> DropWorkspaceResponse:
        """`atmo.mem.workspace.drop`: an ephemeral workspace, or one conversation's plans and files."""
        result: DropWorkspaceResponse = await self._journal.write(MemoryWrite(drop_workspace=request))
        return result

    async def get_plan(self, request: GetPlanRequest, _ctx: MessageContext) -> GetPlanResponse:
        """`atmo.mem.plan.get` (admin)."""
        await self._journal.caught_up()
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
        await self._journal.caught_up()
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
            room -= utf8_len(entry.path) + ENTRY_OVERHEAD
            if room < 0:
                response.next_offset = index
                break
            response.entries.append(FileEntry(path=entry.path, size=entry.size, directory=entry.directory))
        return response

    async def read_file(self, request: ReadFileRequest, _ctx: MessageContext) -> ReadFileResponse:
        """`atmo.mem.files.read` (admin): the content from `offset` that fits in one reply."""
        await self._journal.caught_up()
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
