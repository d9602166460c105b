"""`atmo.gov.screen` and `atmo.gov.screen_facts`: the prompt-injection screens, fail-closed.

Facts bound for long-term memory, tool results and retrieved documents are screened
(`screening.py`, `injection.py`); every non-safe verdict is logged. Every answer fits in one bus
message: facts the screen's answer has no room for are refused (never passed unscreened).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from atmosphere.bus import MessageContext
from atmosphere.contracts.governance.v1.governance_pb2 import (
    DecisionRecord,
    ScreenedFact,
    ScreenFactsRequest,
    ScreenFactsResponse,
    ScreenRequest,
    ScreenResponse,
)
from atmosphere.governance import metrics
from atmosphere.governance.errors import GovernanceBadRequestError
from atmosphere.governance.injection import Breach, ScreenOutcome, screen_fact
from atmosphere.governance.replication import GovernanceJournal
from atmosphere.governance.responders.common import ITEM_OVERHEAD, MAX_FIELD_CHARS, check_fields, now, principal_name
from atmosphere.governance.screening import Screening

SCREEN_POLICY = "memory-safety"
TIER = "RULE_BASED"
MAX_FACTS_PER_REQUEST = 100


@dataclass(frozen=True, slots=True)
class MemorySafety:
    """The memory-injection screen's configuration."""

    enabled: bool = True
    breach: Breach = Breach.DROP
    fail_open: bool = False


class ScreenResponders:
    """Screens texts and facts, logging every verdict that is not safe through the journal."""

    def __init__(
        self, safety: MemorySafety, screening: Screening, journal: GovernanceJournal, *, reply_bytes: int
    ) -> None:
        """Screen facts per `safety`, tool output and documents per `screening`; answers fit `reply_bytes`."""
        self._safety = safety
        self._screening = screening
        self._journal = journal
        self._reply_bytes = reply_bytes

    async def screen(self, request: ScreenRequest, _ctx: MessageContext) -> ScreenResponse:
        """`atmo.gov.screen`: the injection screen over tool results or retrieved documents."""
        check_fields(run_id=request.run_id, kind=request.kind, source=request.source)
        try:
            response = await self._screening.screen(request.kind, list(request.texts))
        except ValueError as exc:
            raise GovernanceBadRequestError(str(exc)[:MAX_FIELD_CHARS]) from None
        for text in response.texts:
            metrics.screened(request.kind, text.verdict)  # the kind is one the screen knows (else it raised)
            if text.verdict != "SAFE":
                await self._journal.decided(
                    DecisionRecord(
                        decision_id=uuid.uuid4().hex,
                        run_id=request.run_id,
                        operation=f"screen_{request.kind}",
                        subject=request.source,
                        allowed=text.keep,
                        policy=f"{request.kind.replace('_', '-')}-safety",
                        reason=f"{text.verdict} ({response.mode}): {text.reason}",
                        principal=principal_name(request.principal),
                        decided_at=now(),
                        outcome="deny" if not text.keep else ("transform" if text.verdict == "INJECTED" else "error"),
                    )
                )
        if response.ByteSize() > self._reply_bytes:
            msg = "the screened texts do not fit in one answer; send fewer or shorter texts"
            raise GovernanceBadRequestError(msg)
        return response

    async def screen_facts(self, request: ScreenFactsRequest, _ctx: MessageContext) -> ScreenFactsResponse:
        """`atmo.gov.screen_facts`: which facts may enter long-term memory, and as what text."""
        check_fields(user_id=request.user_id, conversation_id=request.conversation_id)
        safety = self._safety
        screened: list[ScreenedFact] = []
        room = self._reply_bytes
        for fact in request.facts[:MAX_FACTS_PER_REQUEST]:
            answer, outcome = self._screen_one(fact)
            room -= answer.ByteSize() + ITEM_OVERHEAD
            if room < 0:
                # No room left in one answer: refused, never passed on unscreened.
                answer = ScreenedFact(
                    store=False, verdict="ERROR", reason="no room left in the answer; send fewer facts"
                )
                outcome = None
            screened.append(answer)
            if outcome is not None and outcome.audited:
                verdict = outcome.classification
                await self._journal.decided(
                    DecisionRecord(
                        decision_id=uuid.uuid4().hex,
                        run_id=request.conversation_id,
                        operation="screen_fact",
                        subject=request.user_id,
                        allowed=outcome.store,
                        policy=SCREEN_POLICY,
                        reason=f"{verdict.verdict.value} ({safety.breach.value}): {verdict.reason}",
                        principal=request.user_id or "anonymous",
                        decided_at=now(),
                    )
                )
        # Facts past the cap are refused (none stored), never silently passed unscreened.
        for _ in request.facts[MAX_FACTS_PER_REQUEST:]:
            screened.append(ScreenedFact(store=False, verdict="ERROR", reason="too many facts in one request"))
        response = ScreenFactsResponse(facts=screened, tier=TIER, breach=safety.breach.value)
        if response.ByteSize() > self._reply_bytes:  # even the refusals do not fit: refuse the request
            msg = f"{len(request.facts)} facts in one request; at most {MAX_FACTS_PER_REQUEST} are screened at once"
            raise GovernanceBadRequestError(msg)
        return response

    def _screen_one(self, fact: str) -> tuple[ScreenedFact, ScreenOutcome | None]:
        if not self._safety.enabled:
            return ScreenedFact(store=True, text=fact, verdict="SAFE", reason="screen disabled"), None
        outcome = screen_fact(fact, self._safety.breach, fail_open=self._safety.fail_open)
        verdict = outcome.classification
        metrics.screened("fact", verdict.verdict.value)
        answer = ScreenedFact(
            store=outcome.store,
            text=outcome.text or "",
            verdict=verdict.verdict.value,
            probe=verdict.probe or "",
            reason=verdict.reason,
        )
        return answer, outcome
