"""Governance's responders: admission, tool-call checks, the memory-injection screen, the log.

Admissions, tool calls and answers are decided by the policy plane (`plane.py`): the app's
`atmosphere-policies.yaml`, the configured policy files (native or Microsoft schema) and the
app's Python policies, behind the kill switch; with none installed everything is admitted under
`admit-all`, and the log and the runtime info say so. Every decision names its policy (name,
source, version, digest) and is logged with its evaluation time and context snapshot — of an
answer's checks, the final one and any that stopped it (a streamed answer is checked every 200
characters). A run's end feeds cost accounting and frees its concurrency slot. Facts bound for
long-term memory, tool results and retrieved documents are screened for prompt injection
(`screening.py`, fail-closed); every non-safe verdict is logged.

Whatever changes state goes through governance's log (`replication.py`): decisions, run ends,
the kill switch and reloads are applied by every replica; reads wait for this replica to have
applied what the log held when they began.

Bounds: ids and names longer than `MAX_FIELD_CHARS` are refused (`governance.bad_request`)
before anything is decided or logged; every answer fits in one bus message (`max_payload`):
facts the screen's answer has no room for are refused (never passed unscreened), and the
decision log is returned newest first as far as it fits (`truncated`).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus import MessageContext, Router, subjects
from atmosphere.bus.sizes import DEFAULT_MAX_PAYLOAD, reply_budget
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.governance.v1.governance_pb2 import (
    AdminRequest,
    AdminResponse,
    AdmitRequest,
    CheckOutputRequest,
    CheckRequest,
    CheckResponse,
    CheckToolCallRequest,
    Decision,
    DecisionCounts,
    DecisionRecord,
    KillSwitchChange,
    ListDecisionsRequest,
    ListDecisionsResponse,
    PolicyReload,
    RunEndedAck,
    RunEndedReport,
    RunSettled,
    ScreenedFact,
    ScreenFactsRequest,
    ScreenFactsResponse,
    ScreenRequest,
    ScreenResponse,
)
from atmosphere.governance.errors import GovernanceBadRequestError
from atmosphere.governance.injection import Breach, ScreenOutcome, screen_fact
from atmosphere.governance.plane import NO_POLICY, GovernancePlane, decision_of, outcome_of, snapshot
from atmosphere.governance.policies import Evaluation, PolicyContext, PolicyFileError, Prefer, parse_policies
from atmosphere.governance.replication import GovernanceJournal, GovernanceReplica, record_of
from atmosphere.governance.screening import Screening
from atmosphere.governance.store import DecisionLog

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


def runtime_info(
    safety: MemorySafety | None = None, plane: GovernancePlane | None = None, screening: Screening | None = None
) -> dict[str, Any]:
    """Governance's runtime-truth fragment: the policies and screens really in force."""
    policies = plane.identities() if plane is not None and plane.policies else [{"name": NO_POLICY}]
    governance: dict[str, Any] = {"policies": policies, "decisionLog": "sqlite"}
    if plane is not None:
        governance["killSwitch"] = plane.kill_switch_state()
        governance["checksOutput"] = plane.judges_output
    info: dict[str, Any] = {"governance": governance}
    if safety is not None and safety.enabled:
        info["memorySafety"] = {"active": True, "tier": TIER, "breach": safety.breach.value}
    if screening is not None:
        info.update(screening.runtime_info())
    return info


def _principal(principal: Principal) -> str:
    return principal.user_id or principal.name or principal.auth_method or "anonymous"


def _now() -> Timestamp:
    stamp = Timestamp()
    stamp.FromMilliseconds(int(time.time() * 1000))
    return stamp


class GovernanceHandlers:
    """Admission, tool-call and answer checks, run ends, screens, the decision log, the admin surface."""

    def __init__(
        self,
        log: DecisionLog,
        safety: MemorySafety | None = None,
        *,
        plane: GovernancePlane | None = None,
        screening: Screening | None = None,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        journal: GovernanceJournal | None = None,
    ) -> None:
        """Decide with `plane` (none: admit all), record every decision in `log`, screen per `safety`/`screening`.

        `journal` puts what changes state on governance's log, where every replica applies it to
        its own `log` and `plane`; without one (a single governance) it applies here at once.
        """
        self._log = log
        self._safety = safety or MemorySafety()
        self.plane = plane or GovernancePlane(())
        self._screening = screening or Screening()
        self._reply_bytes = reply_budget(max_payload)
        self._journal = journal or GovernanceJournal(GovernanceReplica(log, self.plane))

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
            installed=bool(self.plane.policies),
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
            principal=_principal(principal),
            decided_at=_now(),
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
        _check_fields(
            run_id=request.run_id,
            agent=request.agent,
            transport=request.transport,
            parent_run_id=request.parent_run_id,
            conversation_id=request.conversation_id,
            session_id=request.session_id,
        )
        _check_principal(request.principal)
        context, evaluation, counts = await self.plane.admit(request)
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
            self.plane.settle(request.run_id)
            raise
        decision.check_output = self.plane.judges_output
        return decision

    async def check_tool(self, request: CheckToolCallRequest, _ctx: MessageContext) -> Decision:
        """`atmo.gov.check_tool`: may this tool call run?"""
        _check_fields(run_id=request.run_id, agent=request.agent, tool_name=request.tool_name)
        _check_principal(request.principal)
        context, evaluation, counts = await self.plane.check_tool(request)
        return await self._answer(
            context,
            evaluation,
            counts,
            run_id=request.run_id,
            operation="check_tool",
            subject=request.tool_name,
            principal=request.principal,
        )

    async def check_output(self, request: CheckOutputRequest, _ctx: MessageContext) -> Decision:
        """`atmo.gov.check_output`: may the answer so far reach the client?"""
        _check_fields(run_id=request.run_id, agent=request.agent)
        _check_principal(request.principal)
        context, evaluation, counts = await self.plane.check_output(request)
        return await self._answer(
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

    async def run_ended(self, request: RunEndedReport, _ctx: MessageContext) -> RunEndedAck:
        """`atmo.gov.run_ended`: account the run's cost and free its concurrency slot."""
        _check_fields(run_id=request.run_id, agent=request.agent, model=request.model)
        _check_principal(request.principal)
        tenant, charge = self.plane.price(request)
        # Every replica frees the slot and accounts the cost, once per run id (a report repeated
        # by a retry, or sent to another replica, changes nothing), and the ledger keeps it.
        settled = RunSettled(
            run_id=request.run_id, tenant=tenant, cost_usd=charge.usd, accounted_at_ms=int(time.time() * 1000)
        )
        await self._journal.settle(settled)
        return RunEndedAck(cost_usd=charge.usd, tenant=tenant, priced=charge.priced)

    async def screen(self, request: ScreenRequest, _ctx: MessageContext) -> ScreenResponse:
        """`atmo.gov.screen`: the injection screen over tool results or retrieved documents."""
        _check_fields(run_id=request.run_id, kind=request.kind, source=request.source)
        try:
            response = await self._screening.screen(request.kind, list(request.texts))
        except ValueError as exc:
            raise GovernanceBadRequestError(str(exc)[:MAX_FIELD_CHARS]) from None
        for text in response.texts:
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
                        principal=_principal(request.principal),
                        decided_at=_now(),
                        outcome="deny" if not text.keep else ("transform" if text.verdict == "INJECTED" else "error"),
                    )
                )
        if response.ByteSize() > self._reply_bytes:
            msg = "the screened texts do not fit in one answer; send fewer or shorter texts"
            raise GovernanceBadRequestError(msg)
        return response

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
                        decided_at=_now(),
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
        await self._journal.caught_up()
        rows = await self._log.recent(run_id=request.run_id, limit=limit)
        records = []
        room = self._reply_bytes
        for row in rows:
            records.append(record_of(row))
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
            await self._journal.caught_up()  # with every reload acknowledged so far
            result = await self.plane.check(body)
        except (ValueError, RecursionError) as exc:
            raise GovernanceBadRequestError(f"Malformed check: {exc}"[:MAX_FIELD_CHARS]) from None
        return CheckResponse(result_json=json.dumps(result))

    def _admin(self, op: str) -> Callable[[AdminRequest, MessageContext], Awaitable[AdminResponse]]:
        """The responder of `atmo.gov.admin.<op>` (JSON body in, JSON answer out)."""

        async def answer(request: AdminRequest, _ctx: MessageContext) -> AdminResponse:
            try:
                body = json.loads(request.body_json or "{}")
            except (ValueError, RecursionError):
                raise GovernanceBadRequestError("the body must be a JSON object") from None
            if not isinstance(body, dict):
                raise GovernanceBadRequestError("the body must be a JSON object")
            return AdminResponse(result_json=json.dumps(await self._admin_result(op, body)))

        return answer

    async def _admin_result(self, op: str, body: dict[str, Any]) -> Any:
        plane = self.plane
        if op in READ_OPS:
            await self._journal.caught_up()  # every replica answers with every change acknowledged
            if op == "policies":
                return plane.policies_view()
            return plane.summary() if op == "summary" else plane.health()
        operator = _text_field(body, "operator") or "unknown"
        if op == "arm":
            reason = _text_field(body, "reason")
            if not reason.strip():
                raise GovernanceBadRequestError("arming the kill switch needs a non-blank 'reason'")
            return await self._journal.switch(KillSwitchChange(armed=True, reason=reason, operator=operator, at=_now()))
        if op == "disarm":
            return await self._journal.switch(KillSwitchChange(armed=False, operator=operator, at=_now()))
        assert op == "reload"
        swap_name, text = _text_field(body, "swapName"), _text_field(body, "yaml")
        if bool(swap_name) != bool(text):
            raise GovernanceBadRequestError("a reload names both 'swapName' and 'yaml', or neither (re-read the files)")
        if swap_name:
            # Refused here, before it is logged, when it cannot apply (every replica would refuse it).
            try:
                parse_policies(text, source=f"reload:{swap_name}")
            except PolicyFileError as exc:
                raise GovernanceBadRequestError(f"Reload refused, nothing changed: {exc}"[:MAX_FIELD_CHARS]) from None
        return await self._journal.reload(PolicyReload(swap_name=swap_name, yaml=text, operator=operator))

    def router(self) -> Router:
        """Governance's subjects."""
        router = Router()
        router.add(subjects.governance("check"), CheckRequest, self.check)
        router.add(subjects.governance("admit"), AdmitRequest, self.admit)
        router.add(subjects.governance("check_tool"), CheckToolCallRequest, self.check_tool)
        router.add(subjects.governance("check_output"), CheckOutputRequest, self.check_output)
        router.add(subjects.governance("run_ended"), RunEndedReport, self.run_ended)
        router.add(subjects.governance("screen"), ScreenRequest, self.screen)
        router.add(subjects.governance("decisions"), ListDecisionsRequest, self.decisions)
        router.add(subjects.governance("screen_facts"), ScreenFactsRequest, self.screen_facts)
        for op in ADMIN_OPS:
            router.add(subjects.governance(f"admin.{op}"), AdminRequest, self._admin(op))
        return router


ADMIN_OPS = ("policies", "summary", "health", "reload", "arm", "disarm")
READ_OPS = frozenset({"policies", "summary", "health"})


def _text_field(body: dict[str, Any], key: str) -> str:
    value = body.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise GovernanceBadRequestError(f"'{key}' must be a string")
    return value
