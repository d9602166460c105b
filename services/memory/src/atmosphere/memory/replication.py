"""Memory with N replicas: one state, through memory's write log.

`ATMO_MEMORY` is the store of record: every write (a turn, a replaced history, screened facts, a
dropped workspace, a writing tool call) is a `MemoryWrite` on it, and every replica applies every
write, in order, to its own store and workspaces (`atmosphere.service.replica.ReplicaLog`), so N
replicas hold one state. A write is answered once stored and applied by the replica that took
it; a read first waits until this replica applied every write the log held when the read began.
Applying a write again (a redelivery after a crash) changes nothing: a turn carries its log
sequence into the store, the other writes leave the same state when repeated.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from google.protobuf.message import Message as ProtoMessage

from atmosphere.bus import subjects
from atmosphere.bus.sizes import DEFAULT_MAX_PAYLOAD
from atmosphere.contracts.memory.v1.memory_pb2 import (
    AppendTurnRequest,
    AppendTurnResponse,
    DropWorkspaceRequest,
    DropWorkspaceResponse,
    MemoryWrite,
    ReplaceHistoryRequest,
    ReplaceHistoryResponse,
)
from atmosphere.memory.errors import MemoryBadRequestError
from atmosphere.memory.store import MemoryStore
from atmosphere.memory.tool_runner import ToolRunner
from atmosphere.memory.vfs import WorkspaceError
from atmosphere.memory.workspaces import Workspaces
from atmosphere.sdk import ChatMessage as Message
from atmosphere.sdk.compaction import parse_strategy
from atmosphere.service.replica import ReplicaLog

MemoryLog = ReplicaLog[MemoryWrite, Any]


def request_digest(message: ProtoMessage) -> str:
    """What identifies a request sent again: its exact content."""
    return hashlib.sha256(message.SerializeToString(deterministic=True)).hexdigest()


def idempotency_id(key: str) -> str:
    """The `Nats-Msg-Id` of a write with idempotency key `key` (fixed length whatever the ids)."""
    return hashlib.sha256(key.encode()).hexdigest() if key else ""


def _from_wire(messages: Any) -> list[Message]:
    try:
        return [Message(m.role, m.content) for m in messages]
    except ValueError as exc:
        raise MemoryBadRequestError(str(exc)) from exc


class MemoryReplica:
    """This replica's memory (its store and workspaces), changed only by applying the log's writes (`apply`)."""

    def __init__(
        self,
        store: MemoryStore,
        workspaces: Workspaces,
        *,
        recent_window: int = 6,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
    ) -> None:
        """Apply writes to `store` and `workspaces`; a tool's file read is paged to fit `max_payload`."""
        self.store = store
        self.tools = ToolRunner(workspaces, max_payload=max_payload)
        self._recent_window = recent_window

    async def apply(self, seq: int, change: MemoryWrite) -> Any:
        """Apply write `seq` of the log to this replica: the same write gives every replica the same state."""
        op = change.WhichOneof("op")
        if op == "append_turn":
            return await self._append_turn(change.append_turn, seq)
        if op == "replace_history":
            return await self._replace_history(change.replace_history)
        if op == "store_facts":
            facts = list(change.store_facts.facts)
            return await self.store.save_facts(change.store_facts.user_id, facts) if facts else 0
        if op == "drop_workspace":
            return await self._drop_workspace(change.drop_workspace)
        if op == "tool":
            return await self.tools.run(change.tool)
        raise MemoryBadRequestError(f"not a memory write: {op}")

    async def _append_turn(self, request: AppendTurnRequest, seq: int) -> AppendTurnResponse:
        compaction = request.compaction
        try:
            stored = await self.store.append_turn(
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

    async def _replace_history(self, request: ReplaceHistoryRequest) -> ReplaceHistoryResponse:
        base = _from_wire(request.base.messages) if request.HasField("base") else None
        digest = (request.base_count, request.base_sha256) if request.base_sha256 else None
        if request.base_count < 0:
            raise MemoryBadRequestError(f"base_count must not be negative, got {request.base_count}")
        messages = _from_wire(request.messages)
        try:
            if not messages and base is None and digest is None:
                await self.store.clear_history(request.agent, request.conversation_id)
                return ReplaceHistoryResponse(stored_messages=0, replaced=True)
            replaced = await self.store.replace_history(
                request.agent, request.conversation_id, messages, base=base, base_digest=digest
            )
        except ValueError as exc:
            raise MemoryBadRequestError(str(exc)) from exc
        return ReplaceHistoryResponse(stored_messages=len(messages) if replaced else 0, replaced=replaced)

    async def _drop_workspace(self, request: DropWorkspaceRequest) -> DropWorkspaceResponse:
        try:
            existed = await asyncio.to_thread(
                self.tools.workspaces.drop, request.workspace, conversation_only=request.conversation_only
            )
        except WorkspaceError as exc:
            raise MemoryBadRequestError(str(exc)) from exc
        return DropWorkspaceResponse(existed=existed)


class MemoryJournal:
    """Where the responders put memory's writes: the write log, or (alone) this replica at once."""

    def __init__(self, replica: MemoryReplica, *, log: MemoryLog | None = None) -> None:
        """Store writes on `log`, which applies them to `replica` (None: each write applies here directly)."""
        self.replica = replica
        self._log = log

    async def write(self, change: MemoryWrite, key: str = "") -> Any:
        """Store `change` and wait until this replica applied it; the apply's answer.

        `key` is its idempotency key ("" for none): a retried write with the same key is stored once.
        """
        if self._log is None:
            return await self.replica.apply(0, change)
        return await self._log.write(subjects.memory_log(), change, msg_id=idempotency_id(key))

    async def caught_up(self) -> None:
        """Before a read: wait until this replica applied every write acknowledged so far."""
        if self._log is not None:
            await self._log.caught_up()
