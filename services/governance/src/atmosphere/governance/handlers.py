"""Governance's responders: admission, tool-call checks, the memory-injection screen, the log.

Admissions and tool calls are decided by the policy ring loaded at start (`plane.py`): the
app's `atmosphere-policies.yaml` and the configured policy files, native or Microsoft schema;
with none installed everything is admitted under `admit-all`, and the log and the runtime info
say so. Every decision names its policy (name, source, version, digest). Facts bound for
long-term memory are screened by the rule-based injection classifier (on by default,
fail-closed); every non-safe verdict is logged.

Bounds: ids and names longer than `MAX_FIELD_CHARS` are refused (`governance.bad_request`)
before anything is decided or logged; every answer fits in one bus message (`max_payload`):
facts the screen's answer has no room for are refused (never passed unscreened), and the
decision log is returned newest first as far as it fits (`truncated`).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus import MessageContext, Router, subjects
from atmosphere.bus.sizes import DEFAULT_MAX_PAYLOAD, reply_budget
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.governance.v1.governance_pb2 import (
    AdmitRequest,
    CheckRequest,
    CheckResponse,
    CheckToolCallRequest,
    Decision,
    DecisionRecord,
    ListDecisionsRequest,
    ListDecisionsResponse,
    ScreenedFact,
    ScreenFactsRequest,
    ScreenFactsResponse,
)
from atmosphere.governance.errors import GovernanceBadRequestError
from atmosphere.governance.injection import Breach, ScreenOutcome, screen_fact
from atmosphere.governance.plane import NO_POLICY, Outcome, admission_context, identities, tool_context
from atmosphere.governance.policies import PolicyContext, PolicyRing, check_request
from atmosphere.governance.store import DecisionLog, DecisionRow

SCREEN_POLICY = "memory-safety"
TIER = "RULE_BASED"
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_FACTS_PER_REQUEST = 100
MAX_FIELD_CHARS = 1024
"""The longest id or name accepted (run ids, agent and tool names, the principal's fields)."""
_ITEM_OVERHEAD = 16
"""Protobuf framing of one screened fact or decision record in a reply."""


def _check_fields(**fields: str) -> None:
    for name, value in fields.items():
        if len(value) > MAX_FIELD_CHARS:
            msg = f"{name} is {len(value)} characters; the limit is {MAX_FIELD_CHARS}"
            raise GovernanceBadRequestError(msg)


def _check_principal(principal: Principal) -> None:
    _check_fields(
        principal_user_id=principal.user_id, principal_name=principal.name, principal_auth=principal.auth_method
    )


@dataclass(frozen=True, slots=True)
class MemorySafety:
    """The memory-injection screen's configuration."""

    enabled: bool = True
    breach: Breach = Breach.DROP
    fail_open: bool = False


def runtime_info(safety: MemorySafety | None = None, ring: PolicyRing | None = None) -> dict[str, Any]:
    """Governance's runtime-truth fragment: the policies really in force."""
    policies = identities(ring) if ring is not None and ring.policies else [{"name": NO_POLICY}]
    info: dict[str, Any] = {"governance": {"policies": policies, "decisionLog": "sqlite"}}
    if safety is not None and safety.enabled:
        info["memorySafety"] = {"active": True, "tier": TIER, "breach": safety.breach.value}
    return info


def _principal(principal: Principal) -> str:
    return principal.user_id or principal.name or principal.auth_method or "anonymous"


class GovernanceHandlers:
    """Admission, tool-call checks and the decision log query."""

    def __init__(
        self,
        log: DecisionLog,
        safety: MemorySafety | None = None,
        *,
        ring: PolicyRing | None = None,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
    ) -> None:
        """Decide with `ring` (none: admit all), record every decision in `log`, screen memory facts per `safety`."""
        self._log = log
        self._safety = safety or MemorySafety()
        self._ring = ring or PolicyRing(())
        self._reply_bytes = reply_budget(max_payload)

    async def _decide(
        self, context: PolicyContext, *, run_id: str, operation: str, subject: str, principal: Principal
    ) -> Decision:
        evaluation = self._ring.evaluate(context)
        decision = Outcome.of(evaluation, decision_id=uuid.uuid4().hex, original_message=context.message).decision
        await self._log.append(
            DecisionRow(
                decision_id=decision.decision_id,
                run_id=run_id,
                operation=operation,
                subject=subject,
                allowed=decision.allowed,
                policy=decision.policy,
                reason=decision.reason,
                principal=_principal(principal),
                decided_at=int(time.time() * 1000),
            )
        )
        return decision

    async def admit(self, request: AdmitRequest, _ctx: MessageContext) -> Decision:
        """`atmo.gov.admit`: may this run start?"""
        _check_fields(run_id=request.run_id, agent=request.agent, transport=request.transport)
        _check_principal(request.principal)
        return await self._decide(
            admission_context(request),
            run_id=request.run_id,
            operation="admit",
            subject=request.agent,
            principal=request.principal,
        )

    async def check_tool(self, request: CheckToolCallRequest, _ctx: MessageContext) -> Decision:
        """`atmo.gov.check_tool`: may this tool call run?"""
        _check_fields(run_id=request.run_id, agent=request.agent, tool_name=request.tool_name)
        _check_principal(request.principal)
        return await self._decide(
            tool_context(request),
            run_id=request.run_id,
            operation="check_tool",
            subject=request.tool_name,
            principal=request.principal,
        )

    async def screen_facts(self, request: ScreenFactsRequest, _ctx: MessageContext) -> ScreenFactsResponse:
        """`atmo.gov.screen_facts`: which facts may enter long-term memory, and as what text."""
        _check_fields(user_id=request.user_id, conversation_id=request.conversation_id)
        safety = self._safety
        screened: list[ScreenedFact] = []
        room = self._reply_bytes
        for fact in request.facts[:MAX_FACTS_PER_REQUEST]:
            answer, outcome = self._screen_one(fact)
            room -= answer.ByteSize() + _ITEM_OVERHEAD
            if room < 0:
                # No room left in one answer: refused, never passed on unscreened.
                answer = ScreenedFact(
                    store=False, verdict="ERROR", reason="no room left in the answer; send fewer facts"
                )
                outcome = None
            screened.append(answer)
            if outcome is not None and outcome.audited:
                verdict = outcome.classification
                await self._log.append(
                    DecisionRow(
                        decision_id=uuid.uuid4().hex,
                        run_id=request.conversation_id,
                        operation="screen_fact",
                        subject=request.user_id,
                        allowed=outcome.store,
                        policy=SCREEN_POLICY,
                        reason=f"{verdict.verdict.value} ({safety.breach.value}): {verdict.reason}",
                        principal=request.user_id or "anonymous",
                        decided_at=int(time.time() * 1000),
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
        answer = ScreenedFact(
            store=outcome.store,
            text=outcome.text or "",
            verdict=verdict.verdict.value,
            probe=verdict.probe or "",
            reason=verdict.reason,
        )
        return answer, outcome

    async def decisions(self, request: ListDecisionsRequest, _ctx: MessageContext) -> ListDecisionsResponse:
        """`atmo.gov.decisions`: the newest decisions, optionally of one run, as many as fit in one reply."""
        _check_fields(run_id=request.run_id)
        limit = request.limit if 0 < request.limit <= MAX_LIMIT else DEFAULT_LIMIT
        rows = await self._log.recent(run_id=request.run_id, limit=limit)
        records = []
        room = self._reply_bytes
        for row in rows:
            decided = Timestamp()
            decided.FromMilliseconds(row.decided_at)
            records.append(
                DecisionRecord(
                    decision_id=row.decision_id,
                    run_id=row.run_id,
                    operation=row.operation,
                    subject=row.subject,
                    allowed=row.allowed,
                    policy=row.policy,
                    reason=row.reason,
                    decided_at=decided,
                    principal=row.principal,
                )
            )
            room -= records[-1].ByteSize() + _ITEM_OVERHEAD
            if room < 0:
                records.pop()
                return ListDecisionsResponse(decisions=records, truncated=True)
        return ListDecisionsResponse(decisions=records)

    async def check(self, request: CheckRequest, _ctx: MessageContext) -> CheckResponse:
        """`atmo.gov.check`: what the policies in force say of an action (MS `/check`; nothing is logged)."""
        try:
            body = json.loads(request.body_json)
            if not isinstance(body, dict):
                msg = "the body must be a JSON object"
                raise ValueError(msg)
            result = check_request(self._ring, body)
        except (ValueError, RecursionError) as exc:
            raise GovernanceBadRequestError(f"Malformed check: {exc}"[:MAX_FIELD_CHARS]) from None
        return CheckResponse(result_json=json.dumps(result))

    def router(self) -> Router:
        """Governance's subjects."""
        router = Router()
        router.add(subjects.governance("check"), CheckRequest, self.check)
        router.add(subjects.governance("admit"), AdmitRequest, self.admit)
        router.add(subjects.governance("check_tool"), CheckToolCallRequest, self.check_tool)
        router.add(subjects.governance("decisions"), ListDecisionsRequest, self.decisions)
        router.add(subjects.governance("screen_facts"), ScreenFactsRequest, self.screen_facts)
        return router
