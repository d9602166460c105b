"""Dispatch's calls to the memory service: history, facts, workspaces.

Memory makes a run better, never possible: when the memory service does not answer, a run goes
on without history (logged), a turn is not recorded, and nothing is raised into the agent.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from atmosphere.bus import Bus, BusError, subjects
from atmosphere.contracts.memory.v1.memory_pb2 import (
    AppendTurnRequest,
    AppendTurnResponse,
    ChatMessage,
    Compaction,
    DropWorkspaceRequest,
    DropWorkspaceResponse,
    GetFactsRequest,
    GetFactsResponse,
    LoadHistoryRequest,
    LoadHistoryResponse,
    ReplaceHistoryRequest,
    ReplaceHistoryResponse,
    SaveFactsRequest,
    SaveFactsResponse,
)
from atmosphere.contracts.tool.v1.tool_pb2 import WorkspaceScope
from atmosphere.sdk import ChatMessage as SdkMessage

log = logging.getLogger("atmosphere.dispatch")

TIMEOUT = 5.0


def to_proto(messages: Sequence[SdkMessage]) -> list[ChatMessage]:
    """SDK messages as memory's wire messages."""
    return [ChatMessage(role=m.role, content=m.content) for m in messages]


def from_proto(messages: Sequence[ChatMessage]) -> list[SdkMessage]:
    """Memory's wire messages as SDK messages (unknown roles are dropped)."""
    return [
        SdkMessage(m.role, m.content)  # type: ignore[arg-type]  # role checked just below
        for m in messages
        if m.role in {"system", "user", "assistant", "tool"}
    ]


class MemoryClient:
    """Request/reply to `atmo.mem.*`, failing soft."""

    def __init__(self, bus: Bus, *, timeout: float = TIMEOUT) -> None:
        """Talk to memory over `bus`."""
        self._bus = bus
        self._timeout = timeout

    async def load_history(self, agent: str, conversation_id: str) -> list[SdkMessage] | None:
        """The conversation so far; None when memory did not answer."""
        try:
            reply = await self._bus.request(
                subjects.memory("history.load"),
                LoadHistoryRequest(agent=agent, conversation_id=conversation_id),
                LoadHistoryResponse,
                timeout=self._timeout,
            )
        except BusError as exc:
            log.warning("memory did not answer history.load for %s/%s (%s): no history", agent, conversation_id, exc)
            return None
        return from_proto(reply.messages)

    async def append_turn(
        self,
        *,
        agent: str,
        conversation_id: str,
        run_id: str,
        user: str,
        assistant: str | None,
        compaction: Compaction,
    ) -> None:
        """Record a turn: the user message, and the answer unless the run failed."""
        request = AppendTurnRequest(
            agent=agent,
            conversation_id=conversation_id,
            run_id=run_id,
            user=ChatMessage(role="user", content=user),
            compaction=compaction,
        )
        if assistant is not None:
            request.assistant.CopyFrom(ChatMessage(role="assistant", content=assistant))
        try:
            await self._bus.request(
                subjects.memory("history.append"), request, AppendTurnResponse, timeout=self._timeout
            )
        except BusError as exc:
            log.warning("memory did not record the turn of run %s (%s)", run_id, exc)

    async def replace_history(
        self,
        agent: str,
        conversation_id: str,
        messages: Sequence[SdkMessage],
        *,
        base: Sequence[SdkMessage] | None = None,
    ) -> bool:
        """Store `messages` as the whole history (a summarized one, or staged prior turns).

        With `base`, only while the stored history still begins with it; False if not replaced.
        """
        request = ReplaceHistoryRequest(agent=agent, conversation_id=conversation_id, messages=to_proto(messages))
        if base is not None:
            request.base.messages.extend(to_proto(base))
        try:
            reply = await self._bus.request(
                subjects.memory("history.replace"), request, ReplaceHistoryResponse, timeout=self._timeout
            )
        except BusError as exc:
            log.warning("memory did not answer history.replace for %s/%s (%s)", agent, conversation_id, exc)
            return False
        return reply.replaced

    async def facts(self, user_id: str, max_facts: int) -> list[str]:
        """What memory knows about `user_id` (newest `max_facts`, oldest first)."""
        try:
            reply = await self._bus.request(
                subjects.memory("facts.get"),
                GetFactsRequest(user_id=user_id, max_facts=max_facts),
                GetFactsResponse,
                timeout=self._timeout,
            )
        except BusError as exc:
            log.warning("memory did not answer facts.get (%s): no facts recalled", exc)
            return []
        return list(reply.facts)

    async def save_facts(self, *, user_id: str, facts: Sequence[str], agent: str, conversation_id: str) -> int:
        """Hand extracted facts to memory (which screens each first); how many it stored."""
        try:
            reply = await self._bus.request(
                subjects.memory("facts.save"),
                SaveFactsRequest(user_id=user_id, facts=list(facts), agent=agent, conversation_id=conversation_id),
                SaveFactsResponse,
                timeout=self._timeout * 2,
            )
        except BusError as exc:
            log.warning("memory did not store facts of conversation %s (%s)", conversation_id, exc)
            return 0
        return reply.stored

    async def drop_workspace(self, scope: WorkspaceScope, *, conversation_only: bool = False) -> None:
        """Remove a workspace's plans and files (an ephemeral sub-agent's, typically)."""
        try:
            await self._bus.request(
                subjects.memory("workspace.drop"),
                DropWorkspaceRequest(workspace=scope, conversation_only=conversation_only),
                DropWorkspaceResponse,
                timeout=self._timeout,
            )
        except BusError as exc:
            log.warning("memory did not drop workspace %s/%s (%s)", scope.category, scope.owner, exc)
