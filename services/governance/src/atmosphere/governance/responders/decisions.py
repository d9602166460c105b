"""`atmo.gov.admit`, `check_tool`, `check_output` and `run_ended`: the policy plane's decisions, logged.

Admissions, tool calls and answers are decided by the policy plane (`plane.py`). Every decision
names its policy (name, source, version, digest) and is logged with its evaluation time and
context snapshot — of an answer's checks, the final one and any that stopped it (a streamed
answer is checked every 200 characters). A run's end feeds cost accounting and frees its
concurrency slot. Each decision is counted and timed here, by the replica that took the request
(`metrics.py`).
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict

from atmosphere.bus import MessageContext
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.governance.v1.governance_pb2 import (
    AdmitRequest,
    CheckOutputRequest,
    CheckToolCallRequest,
    Decision,
    DecisionCounts,
    DecisionRecord,
    RunEndedAck,
    RunEndedReport,
    RunSettled,
)
from atmosphere.governance import metrics
from atmosphere.governance.plane import GovernancePlane, decision_of, outcome_of, snapshot
from atmosphere.governance.policies import Evaluation, PolicyContext, Prefer
from atmosphere.governance.replication import GovernanceJournal
from atmosphere.governance.responders.common import check_fields, check_principal, now, principal_name

MAX_REPORTED_RUNS = 10_000
"""Recent run ends remembered so that a retried report's cost is not observed twice."""


class DecisionResponders:
    """Decides with the plane, answers once the decision is on governance's log; settles runs' ends."""

    def __init__(self, plane: GovernancePlane, journal: GovernanceJournal) -> None:
        """Decide with `plane`; log decisions and runs' ends through `journal`."""
        self._plane = plane
        self._journal = journal
        self._reported: OrderedDict[str, None] = OrderedDict()

    def _first_report(self, run_id: str) -> bool:
        """Whether this replica hears of `run_id`'s end for the first time lately.

        A report retried (dispatch heard no answer) is the same run: its cost is observed once.
        """
        if run_id in self._reported:
            return False
        self._reported[run_id] = None
        while len(self._reported) > MAX_REPORTED_RUNS:
            self._reported.popitem(last=False)
        return True

    async def _answer(
        self,
        context: PolicyContext,
        evaluation: Evaluation,
        counts: DecisionCounts | None,
        *,
        logged: bool = True,
        run_id: str,
        operation: str,
        subject: str,
        principal: Principal,
    ) -> Decision:
        """The decision on `context` as answered, logged (unless not `logged`) with the context after rewrites.

        Answered only once the log holds it (with what the stateful policies counted for it).
        """
        decision = decision_of(
            evaluation,
            decision_id=uuid.uuid4().hex,
            original_message=context.message,
            installed=bool(self._plane.policies),
        )
        if not logged:
            return decision
        preferred = evaluation.decision.preferred if isinstance(evaluation.decision, Prefer) else ""
        record = DecisionRecord(
            decision_id=decision.decision_id,
            run_id=run_id,
            operation=operation,
            subject=subject,
            allowed=decision.allowed,
            policy=decision.policy,
            reason=decision.reason,
            principal=principal_name(principal),
            decided_at=now(),
            policy_source=decision.policy_source,
            policy_version=decision.policy_version,
            policy_digest=decision.policy_digest,
            outcome=outcome_of(evaluation),
            evaluation_ms=round(evaluation.evaluation_ms, 3),
            # After every rewrite: a redacted message is what is logged.
            context_json=snapshot(evaluation.context, preferred=preferred),
        )
        await self._journal.decided(record, counts)
        return decision

    async def admit(self, request: AdmitRequest, _ctx: MessageContext) -> Decision:
        """`atmo.gov.admit`: may this run start? A sub-run's admission is its delegation edge."""
        started = time.perf_counter()
        check_fields(
            run_id=request.run_id,
            agent=request.agent,
            transport=request.transport,
            parent_run_id=request.parent_run_id,
            conversation_id=request.conversation_id,
            session_id=request.session_id,
        )
        check_principal(request.principal)
        context, evaluation, counts = await self._plane.admit(request)
        try:
            decision = await self._answer(
                context,
                evaluation,
                counts,
                run_id=request.run_id,
                operation="admit",
                subject=request.agent,
                principal=request.principal,
            )
        except Exception:
            # Not stored, so not admitted: the slot goes back (its rate-limit hit stays, here only).
            self._plane.settle(request.run_id)
            raise
        decision.check_output = self._plane.judges_output
        metrics.decided("admit", decision, started)
        return decision

    async def check_tool(self, request: CheckToolCallRequest, _ctx: MessageContext) -> Decision:
        """`atmo.gov.check_tool`: may this tool call run?"""
        started = time.perf_counter()
        check_fields(run_id=request.run_id, agent=request.agent, tool_name=request.tool_name)
        check_principal(request.principal)
        context, evaluation, counts = await self._plane.check_tool(request)
        decision = await self._answer(
            context,
            evaluation,
            counts,
            run_id=request.run_id,
            operation="check_tool",
            subject=request.tool_name,
            principal=request.principal,
        )
        metrics.decided("check_tool", decision, started)
        return decision

    async def check_output(self, request: CheckOutputRequest, _ctx: MessageContext) -> Decision:
        """`atmo.gov.check_output`: may the answer so far reach the client?"""
        started = time.perf_counter()
        check_fields(run_id=request.run_id, agent=request.agent)
        check_principal(request.principal)
        context, evaluation, counts = await self._plane.check_output(request)
        decision = await self._answer(
            context,
            evaluation,
            counts,
            # Not every 200-character check of every answer: the final one and any that stopped it.
            logged=request.final or not evaluation.allowed,
            run_id=request.run_id,
            operation="check_output",
            subject=request.agent,
            principal=request.principal,
        )
        # Every check of a streamed answer counts (one each 200 characters), logged or not.
        metrics.decided("check_output", decision, started)
        return decision

    async def run_ended(self, request: RunEndedReport, _ctx: MessageContext) -> RunEndedAck:
        """`atmo.gov.run_ended`: account the run's cost and free its concurrency slot."""
        check_fields(run_id=request.run_id, agent=request.agent, model=request.model)
        check_principal(request.principal)
        tenant, charge = self._plane.price(request)
        # Every replica frees the slot and accounts the cost, once per run id (a report repeated
        # by a retry, or sent to another replica, changes nothing), and the ledger keeps it.
        settled = RunSettled(
            run_id=request.run_id, tenant=tenant, cost_usd=charge.usd, accounted_at_ms=int(time.time() * 1000)
        )
        await self._journal.settle(settled)
        if self._first_report(request.run_id):
            metrics.priced(request.agent, request.model, charge.usd, complete=charge.priced)
        return RunEndedAck(cost_usd=charge.usd, tenant=tenant, priced=charge.priced)
