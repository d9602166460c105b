"""Dispatch's calls to the memory service: history, facts, workspaces.

A history that cannot be loaded is an error (`HistoryUnavailableError`): a run must not go on
as if the conversation were new. Everything else fails soft: a turn that memory does not
record, facts it does not return, a workspace it does not drop are logged, never raised into
the agent.

Sizes: every request fits in one bus message. A history is read in pages (memory splits a
message too large for one page; the parts are joined here); a turn is cut to what memory keeps
of a message, with memory's marker; facts go in as many requests as they need; a summarized
history replaces the stored one guarded by a digest of the base instead of the base itself.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from atmosphere.bus import (
    Bus,
    BusError,
    NoRespondersError,
    PayloadTooLargeError,
    RemoteError,
    RequestTimeoutError,
    request_retrying,
    subjects,
)
from atmosphere.bus.errors import HistoryChangedError, HistoryUnavailableError
from atmosphere.bus.sizes import data_budget, head, utf8_len
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
from atmosphere.sdk.compaction import history_digest

log = logging.getLogger("atmosphere.dispatch")

TIMEOUT = 5.0
APPEND_ATTEMPTS = 3
"""A history read or a turn's append is tried for this many timeouts before it is given up."""
MAX_HISTORY_PAGES = 1024
"""A history of more pages than this is refused (memory answering the same page forever, say)."""
HISTORY_ATTEMPTS = 3
"""Reads of a history that keeps changing between its pages before giving up."""
MAX_STORED_MESSAGE_BYTES = 256 * 1024
"""What memory keeps of one message; a longer turn is cut here, with memory's own marker."""
TRUNCATION_MARKER = "\n…[truncated]"
_FACT_OVERHEAD = 8
"""Protobuf framing of one fact in a request."""


def history_unavailable(reason: str) -> HistoryUnavailableError:
    """The error a run ends with when its history cannot be loaded (it must not forget it)."""
    return HistoryUnavailableError(
        f"The conversation history could not be loaded ({reason}); the run was stopped rather than"
        " answered without it. Try again."
    )


def _reason(exc: BusError) -> str:
    if isinstance(exc, RequestTimeoutError):
        return "memory did not answer in time"
    if isinstance(exc, NoRespondersError):
        return "no memory service is running"
    if isinstance(exc, RemoteError):
        return f"memory answered {exc.code}: {exc.message}"
    return f"the request failed: {exc}"


def bound_turn(content: str, max_bytes: int) -> str:
    """`content` cut to `max_bytes` of UTF-8, ending with memory's truncation marker when cut."""
    if utf8_len(content) <= max_bytes:
        return content
    return head(content, max_bytes - utf8_len(TRUNCATION_MARKER)) + TRUNCATION_MARKER


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

    async def load_history(self, agent: str, conversation_id: str) -> list[SdkMessage]:
        """The conversation so far, read page by page.

        Raises:
            HistoryUnavailableError: memory did not answer, refused, or the pages did not add up.
        """
        failure: BusError
        for attempt in range(1, HISTORY_ATTEMPTS + 1):
            try:
                return from_proto(await self._pages(agent, conversation_id))
            except RemoteError as exc:
                if isinstance(exc.error, HistoryChangedError) and attempt < HISTORY_ATTEMPTS:
                    continue  # a turn landed between two pages: read it again
                failure = exc
            except BusError as exc:
                failure = exc
            log.warning("history.load for %s/%s failed: %s", agent, conversation_id, failure)
            raise history_unavailable(_reason(failure)) from failure
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    async def _pages(self, agent: str, conversation_id: str) -> list[ChatMessage]:
        """Every page of a history, the parts of split messages joined."""
        messages: list[ChatMessage] = []
        joining = False
        token = ""
        for _ in range(MAX_HISTORY_PAGES):
            # A read, safe to repeat: a page lost with a memory replica killed mid-answer (or
            # refused by one still catching up) is asked again, of a replica that answers.
            reply = await request_retrying(
                self._bus,
                subjects.memory("history.load"),
                LoadHistoryRequest(agent=agent, conversation_id=conversation_id, page_token=token),
                LoadHistoryResponse,
                deadline=self._timeout * APPEND_ATTEMPTS,
                attempt_timeout=self._timeout,
                answers=(HistoryChangedError,),  # read again from the first page, by load_history
            )
            for message in reply.messages:
                if joining:
                    messages[-1].content += message.content
                else:
                    messages.append(ChatMessage(role=message.role, content=message.content))
                joining = message.partial
            if not reply.next_page_token:
                return messages
            if reply.next_page_token == token:
                msg = "memory answered the same history page twice"
                raise history_unavailable(msg)
            token = reply.next_page_token
        msg = f"the history has more than {MAX_HISTORY_PAGES} pages"
        raise history_unavailable(msg)

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
        """Record a turn: the user message, and the answer unless the run failed.

        Each is cut to what memory keeps of a message (and to half of one bus message).
        """
        limit = min(MAX_STORED_MESSAGE_BYTES, data_budget(self._bus.max_payload) // 2)
        request = AppendTurnRequest(
            agent=agent,
            conversation_id=conversation_id,
            run_id=run_id,
            user=ChatMessage(role="user", content=bound_turn(user, limit)),
            compaction=compaction,
        )
        if assistant is not None:
            request.assistant.CopyFrom(ChatMessage(role="assistant", content=bound_turn(assistant, limit)))
        try:
            # Safe to repeat: memory stores one turn per run id, so a turn whose answer was lost
            # (a memory replica killed, a NATS node failing over) is sent again, not dropped.
            await request_retrying(
                self._bus,
                subjects.memory("history.append"),
                request,
                AppendTurnResponse,
                deadline=self._timeout * APPEND_ATTEMPTS,
                attempt_timeout=self._timeout,
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

        With `base`, only while the stored history still begins with it (checked by digest, so
        a base larger than one bus message is no obstacle); False if not replaced, also when the
        replacement itself is too large to send (the stored history then stays as it was).
        """
        request = ReplaceHistoryRequest(agent=agent, conversation_id=conversation_id, messages=to_proto(messages))
        if base is not None:
            request.base_count = len(base)
            request.base_sha256 = history_digest(to_proto(base))
        try:
            reply = await self._bus.request(
                subjects.memory("history.replace"), request, ReplaceHistoryResponse, timeout=self._timeout
            )
        except PayloadTooLargeError as exc:
            log.warning("history of %s/%s not replaced: %s; it stays as it was", agent, conversation_id, exc)
            return False
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
        """Hand extracted facts to memory (which screens each first); how many it stored.

        In as many requests as needed for each to fit in one bus message.
        """
        stored = 0
        limit = data_budget(self._bus.max_payload)
        batch = SaveFactsRequest(user_id=user_id, agent=agent, conversation_id=conversation_id)
        for extracted in facts:
            fact = head(extracted, limit // 2)  # memory keeps 1,000 characters of a fact anyway
            if batch.facts and batch.ByteSize() + utf8_len(fact) + _FACT_OVERHEAD > limit:
                stored += await self._save_batch(batch)
                batch = SaveFactsRequest(user_id=user_id, agent=agent, conversation_id=conversation_id)
            batch.facts.append(fact)
        if batch.facts:
            stored += await self._save_batch(batch)
        return stored

    async def _save_batch(self, request: SaveFactsRequest) -> int:
        try:
            reply = await self._bus.request(
                subjects.memory("facts.save"), request, SaveFactsResponse, timeout=self._timeout * 2
            )
        except BusError as exc:
            log.warning("memory did not store facts of conversation %s (%s)", request.conversation_id, exc)
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
