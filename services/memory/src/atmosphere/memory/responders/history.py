"""`atmo.mem.history.*`: a conversation's history, read in pages, appended and replaced through the write log."""

from __future__ import annotations

from atmosphere.bus import MessageContext
from atmosphere.bus.errors import HistoryChangedError
from atmosphere.bus.sizes import DEFAULT_MAX_PAYLOAD, reply_budget
from atmosphere.contracts.memory.v1.memory_pb2 import (
    AppendTurnRequest,
    AppendTurnResponse,
    ChatMessage,
    LoadHistoryRequest,
    LoadHistoryResponse,
    MemoryWrite,
    ReplaceHistoryRequest,
    ReplaceHistoryResponse,
)
from atmosphere.memory import metrics
from atmosphere.memory.errors import MemoryBadRequestError
from atmosphere.memory.replication import MemoryJournal, request_digest
from atmosphere.memory.store import MemoryStore, StalePageTokenError


class HistoryResponders:
    """Loads a history page by page from this replica's store; appends and replacements go through the journal."""

    def __init__(self, store: MemoryStore, journal: MemoryJournal, *, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        """Read from `store`, write through `journal`; every page fits in one message of `max_payload` bytes."""
        self._store = store
        self._journal = journal
        self._reply_bytes = reply_budget(max_payload)

    async def load_history(self, request: LoadHistoryRequest, _ctx: MessageContext) -> LoadHistoryResponse:
        """`atmo.mem.history.load`: one page of the history (`next_page_token` says if more follow)."""
        await self._journal.caught_up()
        try:
            page = await self._store.history_page(
                request.agent, request.conversation_id, request.page_token, max_bytes=self._reply_bytes
            )
        except StalePageTokenError as exc:
            # Retryable: the same read, started again from the first page, succeeds.
            raise HistoryChangedError(str(exc), retryable=True) from exc
        except ValueError as exc:
            raise MemoryBadRequestError(str(exc)) from exc
        metrics.HISTORY_READS.inc()
        return LoadHistoryResponse(
            messages=[ChatMessage(role=m.role, content=m.content, partial=m.partial) for m in page.messages],
            next_page_token=page.next_token,
        )

    async def append_turn(self, request: AppendTurnRequest, _ctx: MessageContext) -> AppendTurnResponse:
        """`atmo.mem.history.append`: the user turn, and the answer unless the run failed."""
        # The caller retries an append that timed out with the same bytes: stored once. The key
        # is the run and the request's content, so two different turns of one run both count.
        key = f"turn:{request.run_id}:{request_digest(request)}" if request.run_id else ""
        result: AppendTurnResponse = await self._journal.write(MemoryWrite(append_turn=request), key)
        metrics.HISTORY_APPENDS.inc()
        return result

    async def replace_history(self, request: ReplaceHistoryRequest, _ctx: MessageContext) -> ReplaceHistoryResponse:
        """`atmo.mem.history.replace`: a summarized history, staged turns, or empty to clear."""
        result: ReplaceHistoryResponse = await self._journal.write(MemoryWrite(replace_history=request))
        metrics.HISTORY_REPLACES.inc()
        return result
