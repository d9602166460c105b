"""`atmo.mem.facts.*`: long-term facts, screened by governance before they are stored, recalled newest first."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from atmosphere.bus import MessageContext
from atmosphere.bus.sizes import DEFAULT_MAX_PAYLOAD, data_budget, reply_budget, utf8_len
from atmosphere.contracts.governance.v1.governance_pb2 import ScreenFactsRequest, ScreenFactsResponse
from atmosphere.contracts.memory.v1.memory_pb2 import (
    GetFactsRequest,
    GetFactsResponse,
    MemoryWrite,
    SaveFactsRequest,
    SaveFactsResponse,
)
from atmosphere.memory import metrics
from atmosphere.memory.errors import MemoryBadRequestError
from atmosphere.memory.replication import MemoryJournal
from atmosphere.memory.responders.sizing import ENTRY_OVERHEAD
from atmosphere.memory.store import MemoryStore, bound_fact

log = logging.getLogger("atmosphere.memory")

ScreenFacts = Callable[[ScreenFactsRequest], Awaitable[ScreenFactsResponse]]
MAX_FACTS = 100


class FactResponders:
    """Screens facts and stores what passed through the journal; recalls the newest that fit in one reply."""

    def __init__(
        self, store: MemoryStore, screen: ScreenFacts, journal: MemoryJournal, *, max_payload: int = DEFAULT_MAX_PAYLOAD
    ) -> None:
        """Recall from `store`; store through `journal` what `screen` (governance) passed; fit `max_payload`."""
        self._store = store
        self._screen = screen
        self._journal = journal
        self._reply_bytes = reply_budget(max_payload)
        self._request_bytes = data_budget(max_payload)

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
        screened_facts = SaveFactsRequest(user_id=request.user_id, facts=keep)
        stored = await self._journal.write(MemoryWrite(store_facts=screened_facts))
        metrics.facts_saved(offered=len(facts), kept=len(keep), flagged=flagged)
        return SaveFactsResponse(stored=stored, dropped=len(facts) - len(keep), flagged=flagged)

    def _screen_batches(self, facts: list[str], request: SaveFactsRequest) -> list[ScreenFactsRequest]:
        """`facts` as screen requests that each fit in one bus message."""
        batches: list[ScreenFactsRequest] = []
        batch = ScreenFactsRequest(user_id=request.user_id, conversation_id=request.conversation_id)
        for fact in facts:
            cost = utf8_len(fact) + ENTRY_OVERHEAD
            if batch.facts and batch.ByteSize() + cost > self._request_bytes:
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
        await self._journal.caught_up()
        metrics.FACT_RECALLS.inc()
        facts = await self._store.get_facts(request.user_id, request.max_facts or 20)
        room = self._reply_bytes
        kept = 0
        for fact in reversed(facts):  # the newest matter most: they are kept first
            room -= utf8_len(fact) + ENTRY_OVERHEAD
            if room < 0:
                break
            kept += 1
        if kept < len(facts):
            left_out = len(facts) - kept
            log.warning("facts of %s: the %d oldest of %d left out of one reply", request.user_id, left_out, len(facts))
        return GetFactsResponse(facts=facts[len(facts) - kept :], truncated=kept < len(facts))
