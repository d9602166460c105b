"""Governance's first responder: admit every request and tool call, and log each decision.

The policy plane (YAML policies, guardrails, screens) arrives later; until then the one
policy in force is `admit-all`, and it says so in the decision log and the runtime info.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus import MessageContext, Router, subjects
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.governance.v1.governance_pb2 import (
    AdmitRequest,
    CheckToolCallRequest,
    Decision,
    DecisionRecord,
    ListDecisionsRequest,
    ListDecisionsResponse,
)
from atmosphere.governance.store import DecisionLog, DecisionRow

POLICY = "admit-all"
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000


def runtime_info() -> dict[str, Any]:
    """Governance's runtime-truth fragment."""
    return {"governance": {"policies": [POLICY], "decisionLog": "sqlite"}}


def _principal(principal: Principal) -> str:
    return principal.user_id or principal.name or principal.auth_method or "anonymous"


class GovernanceHandlers:
    """Admission, tool-call checks and the decision log query."""

    def __init__(self, log: DecisionLog) -> None:
        """Record every decision in `log`."""
        self._log = log

    async def _decide(self, *, run_id: str, operation: str, subject: str, principal: Principal) -> Decision:
        decision = Decision(
            allowed=True, policy=POLICY, reason="no policy restricts this request", decision_id=uuid.uuid4().hex
        )
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
        return await self._decide(
            run_id=request.run_id, operation="admit", subject=request.agent, principal=request.principal
        )

    async def check_tool(self, request: CheckToolCallRequest, _ctx: MessageContext) -> Decision:
        """`atmo.gov.check_tool`: may this tool call run?"""
        return await self._decide(
            run_id=request.run_id, operation="check_tool", subject=request.tool_name, principal=request.principal
        )

    async def decisions(self, request: ListDecisionsRequest, _ctx: MessageContext) -> ListDecisionsResponse:
        """`atmo.gov.decisions`: the newest decisions, optionally of one run."""
        limit = request.limit if 0 < request.limit <= MAX_LIMIT else DEFAULT_LIMIT
        rows = await self._log.recent(run_id=request.run_id, limit=limit)
        records = []
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
        return ListDecisionsResponse(decisions=records)

    def router(self) -> Router:
        """Governance's subjects."""
        router = Router()
        router.add(subjects.governance("admit"), AdmitRequest, self.admit)
        router.add(subjects.governance("check_tool"), CheckToolCallRequest, self.check_tool)
        router.add(subjects.governance("decisions"), ListDecisionsRequest, self.decisions)
        return router
