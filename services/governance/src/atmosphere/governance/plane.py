"""The policy plane as governance runs it: the policies in force, each request as a policy context.

Policies come from `atmosphere-policies.yaml` in the app directory (`ATMOSPHERE_APP_DIR`), the
files listed in `ATMOSPHERE_GOVERNANCE__POLICY_FILES`, and the app's Python policies
(`App(policies=[...])` and `register_policy`), in that order, behind the built-in kill switch. A
file that does not parse stops governance at start (fail-closed), naming the file and line; a
reload that does not parse changes nothing. No policy at all admits everything, and says so.

State the policies keep across requests lives here too: the concurrency slots of admitted runs
(given back when the run ends, once), and the cost fed to cost ceilings from each run's usage.
Each decision also says what the stateful policies counted for it (`counting.py`), so that the
other governance replicas count the same (`observe`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.governance.v1.governance_pb2 import (
    AdmitRequest,
    CheckOutputRequest,
    CheckToolCallRequest,
    Decision,
    DecisionCounts,
    RunEndedReport,
)
from atmosphere.governance.counting import counted_context, counts_of, observe, slots_taken
from atmosphere.governance.policies import (
    Admit,
    AllowListPolicy,
    AuthorizationPolicy,
    ConcurrencyLimitPolicy,
    CostCeilingPolicy,
    Deny,
    DryRunPolicy,
    Evaluation,
    KillSwitch,
    MessageLengthPolicy,
    MetadataPresencePolicy,
    Phase,
    Policy,
    PolicyContext,
    PolicyFileError,
    PolicyRing,
    Prefer,
    PreferencePolicy,
    RateLimitPolicy,
    TimeWindowPolicy,
    Transform,
    check_request,
    load_policy_files,
    parse_policies,
)
from atmosphere.governance.policies.model import (
    DEFAULT_TENANT,
    PARTIAL_METADATA_KEY,
    RESPONSE_CHARS_METADATA_KEY,
    TENANT_METADATA_KEY,
    preview,
)
from atmosphere.governance.pricing import Charge, PricingTable
from atmosphere.service.pii import GUARDRAIL_PATTERNS, redact_text

log = logging.getLogger("atmosphere.governance")

APP_POLICY_FILE = "atmosphere-policies.yaml"
"""The policy file an app ships in its directory."""
NO_POLICY = "admit-all"
"""What the log names when no policy is installed (everything is admitted)."""
ALL_ADMITTED = "policy-ring"
"""What the log names when policies are installed and every one of them admitted."""
SNAPSHOT_CHARS = 200
"""Characters of the message, the response and each metadata value kept in a context snapshot."""
MAX_HELD_RUNS = 100_000
"""Admitted runs whose concurrency slot is tracked; past it the oldest slot is given back."""
ADMISSION_ONLY = (
    AllowListPolicy,
    AuthorizationPolicy,
    ConcurrencyLimitPolicy,
    CostCeilingPolicy,
    KillSwitch,
    MessageLengthPolicy,
    MetadataPresencePolicy,
    PreferencePolicy,
    RateLimitPolicy,
    TimeWindowPolicy,
)
"""Policy types that never judge an answer: with only these in force, no answer is sent to be checked."""


def policy_paths(app_dir: Path, files: Sequence[Path]) -> list[Path]:
    """The policy files in force: the app's own (if it has one), then the configured ones."""
    own = app_dir / APP_POLICY_FILE
    return [own, *files] if own.is_file() else list(files)


def load_policies(app_dir: Path, files: Sequence[Path], code: Sequence[Policy] = ()) -> list[Policy]:
    """Every policy in force: the files' (in order), then those written in Python.

    Raises:
        PolicyFileError: a file does not parse.
    """
    return [*load_policy_files(policy_paths(app_dir, files)), *code]


def _unwrapped(policy: Policy) -> Policy:
    return policy.wrapped if isinstance(policy, DryRunPolicy) else policy


def _private(text: str) -> str:
    """`text` as the log keeps it: personal data masked (the audit trail must not become a store of it)."""
    return redact_text(text, GUARDRAIL_PATTERNS)


def snapshot(context: PolicyContext, *, preferred: str = "") -> str:
    """The seed's context snapshot of `context`, as JSON (every value bounded, PII masked)."""
    shot: dict[str, Any] = {"phase": context.phase.value, "message": _private(preview(context.message, SNAPSHOT_CHARS))}
    for key in ("model", "user_id", "session_id", "agent_id", "conversation_id"):
        value = getattr(context, key)
        if value:
            shot[key] = value
    for key, value in context.metadata.items():
        if key in shot:
            continue
        if value is None:
            shot[key] = ""
        elif isinstance(value, bool | int | float):
            shot[key] = value
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
            shot[key] = _private(preview(text, SNAPSHOT_CHARS))
    if context.response:
        shot["response_preview"] = _private(preview(context.response, SNAPSHOT_CHARS))
    if preferred:
        shot["preferred"] = preferred
    return json.dumps(shot, ensure_ascii=False)


def outcome_of(evaluation: Evaluation) -> str:
    """The log's decision word: admit, transform, deny or prefer."""
    decision = evaluation.decision
    if isinstance(decision, Deny):
        return "deny"
    if isinstance(decision, Transform):
        return "transform"
    if isinstance(decision, Prefer):
        return "prefer"
    return "admit"


def _server_metadata(principal: Principal, **extra: Any) -> dict[str, Any]:
    """Context keys set by governance from the authenticated principal (a client never sets them)."""
    return {"roles": list(principal.roles), TENANT_METADATA_KEY: principal.tenant, **extra}


def admission_context(request: AdmitRequest) -> PolicyContext:
    """A run about to start, as policies see it: a sub-run's admission is its delegation edge."""
    principal = request.principal
    metadata: dict[str, Any] = dict(request.metadata)
    metadata.update(
        _server_metadata(
            principal,
            transport=request.transport,
            action="delegate" if request.parent_run_id else "run",
        )
    )
    if request.parent_run_id:
        metadata["parent_run_id"] = request.parent_run_id
    return PolicyContext(
        phase=Phase.PRE_ADMISSION,
        message=request.message,
        user_id=principal.user_id,
        session_id=request.session_id,
        agent_id=request.agent,
        conversation_id=request.conversation_id,
        metadata=metadata,
    )


def tool_context(request: CheckToolCallRequest) -> PolicyContext:
    """A tool call about to run (the seed's synthetic `call_tool:<tool>` request)."""
    try:
        arguments = json.loads(request.arguments_json or "{}")
    except (ValueError, RecursionError):
        arguments = {}
    context = PolicyContext.for_tool_call(
        tool=request.tool_name,
        arguments=arguments if isinstance(arguments, dict) else {},
        user_id=request.principal.user_id,
        agent_id=request.agent,
        conversation_id=request.conversation_id,
        session_id=request.session_id,
        roles=tuple(request.principal.roles),
    )
    metadata = dict(context.metadata)
    metadata[TENANT_METADATA_KEY] = request.principal.tenant
    metadata.setdefault("roles", [])
    return dataclasses.replace(context, metadata=metadata)


def output_context(request: CheckOutputRequest) -> PolicyContext:
    """A run's answer so far (post-response phase; `partial` until the final check)."""
    principal = request.principal
    return PolicyContext(
        phase=Phase.POST_RESPONSE,
        message=request.message,
        user_id=principal.user_id,
        session_id=request.session_id,
        agent_id=request.agent,
        conversation_id=request.conversation_id,
        metadata=_server_metadata(
            principal,
            action="respond",
            **{PARTIAL_METADATA_KEY: not request.final, RESPONSE_CHARS_METADATA_KEY: request.response_chars},
        ),
        response=request.response,
    )


def decision_of(
    evaluation: Evaluation, *, decision_id: str, original_message: str, installed: bool = False
) -> Decision:
    """The answer for `evaluation` (its policy's identity included).

    An admit no single policy made is named `admit-all` when nothing is installed, else
    `policy-ring` (every installed policy admitted).
    """
    identity = evaluation.policy
    answer = Decision(
        decision_id=decision_id,
        policy=identity.name if identity is not None else (ALL_ADMITTED if installed else NO_POLICY),
        policy_source=identity.source if identity is not None else "",
        policy_version=identity.version if identity is not None else "",
        policy_digest=identity.digest if identity is not None else "",
        outcome=outcome_of(evaluation),
    )
    result = evaluation.decision
    if isinstance(result, Deny):
        answer.allowed, answer.reason = False, result.reason
    elif isinstance(result, Transform):
        answer.allowed, answer.reason = True, "request rewritten"
        if result.context.message != original_message:
            answer.rewritten_message = result.context.message
    elif isinstance(result, Prefer):
        answer.allowed = True
        answer.reason = f"prefer {result.preferred}: {result.reason}"
    else:
        assert isinstance(result, Admit)
        answer.allowed = True
        answer.reason = "no policy restricts this request" if identity is None and not installed else ""
    return answer


Judged = tuple[PolicyContext, Evaluation, DecisionCounts | None]
"""A request as judged: its context, the ring's evaluation, what the stateful policies counted."""


@dataclass
class _Held:
    context: PolicyContext
    since: float


def set_digest(policies: Sequence[Policy]) -> str:
    """`sha256:<hex>` of a set of policies, in order: it changes when any one of them does.

    What a reload answers with: the first policy's own digest would stay the same when only a
    later policy of the document changed.
    """
    material = "\n".join(p.identity.digest for p in policies).encode()
    return "sha256:" + hashlib.sha256(material).hexdigest()


class GovernancePlane:
    """The policies in force behind the kill switch, and the state they keep between requests."""

    def __init__(
        self,
        policies: Sequence[Policy],
        *,
        pricing: PricingTable | None = None,
        kill_switch: KillSwitch | None = None,
        reload_from: Callable[[], list[Policy]] | None = None,
        slot_ttl: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Install `policies`; `reload_from` re-reads them for a plain reload (None: not reloadable)."""
        self.kill_switch = kill_switch or KillSwitch()
        self.pricing = pricing or PricingTable.load()
        self._reload_from = reload_from
        self._slot_ttl = slot_ttl
        self._clock = clock
        self._held: OrderedDict[str, _Held] = OrderedDict()
        self._ended: OrderedDict[str, None] = OrderedDict()
        self.spend: dict[str, float] = {}
        """USD accounted per tenant since start (what `/summary` shows)."""
        self._install(policies)

    # -- what is in force ----------------------------------------------------------------------

    def _install(self, policies: Sequence[Policy]) -> None:
        self.policies: tuple[Policy, ...] = tuple(policies)
        self.ring = PolicyRing((self.kill_switch, *self.policies))
        self._answer_ring = PolicyRing(self.policies)
        live = [_unwrapped(p) for p in self.policies if not isinstance(p, DryRunPolicy)]
        self._cost_ceilings = [p for p in live if isinstance(p, CostCeilingPolicy)]
        self._limits_concurrency = any(isinstance(p, ConcurrencyLimitPolicy) for p in live)
        self.judges_output = any(not isinstance(p, ADMISSION_ONLY) for p in live)
        # A policy that waits on I/O (an LLM moderation tier) must not hold the event loop:
        # with one installed, rings are evaluated on worker threads (policies guard their state).
        self.blocking = any(getattr(_unwrapped(p), "blocking", False) for p in self.policies)

    def reload(self, *, swap_name: str = "", text: str = "") -> dict[str, Any]:
        """Swap the policies named `swap_name` for those `text` defines, or (no name) re-read every file.

        Atomic: the new set is parsed whole before it replaces the old one; a failure changes nothing.

        Raises:
            PolicyFileError: the new policies do not parse, or no policy is named `swap_name`.
        """
        if not swap_name:
            if self._reload_from is None:
                raise PolicyFileError("this governance was not started from policy files")
            fresh = self._reload_from()
            reloaded: Sequence[Policy] = fresh
        else:
            if not any(p.identity.name == swap_name for p in self.policies):
                raise PolicyFileError(f"no policy named {swap_name!r} is installed")
            reloaded = parse_policies(text, source=f"reload:{swap_name}")
            fresh, placed = [], False
            for policy in self.policies:
                if policy.identity.name != swap_name:
                    fresh.append(policy)
                elif not placed:
                    fresh.extend(reloaded)
                    placed = True
        self._carry_state(fresh)
        self._install(fresh)
        log.warning("policies reloaded (%s): %d in force", swap_name or "all files", len(fresh))
        first = reloaded[0].identity if reloaded else None
        return {
            "reloaded": swap_name or "all",
            "version": first.version if first else "",
            "digest": set_digest(reloaded),
            "policyCount": len(self.policies),
        }

    def _carry_state(self, fresh: Sequence[Policy]) -> None:
        """A reload keeps what tenants already spent (a new ceiling applies to the same window)."""
        for policy in fresh:
            target = _unwrapped(policy)
            if isinstance(target, CostCeilingPolicy):
                for tenant, usd in self.spend.items():
                    target.add_cost(tenant, usd)

    def arm(self, reason: str, operator: str, *, at: datetime | None = None) -> dict[str, Any]:
        """Arm the kill switch (at `at`, default now): every admission and tool call is denied with `reason`."""
        self.kill_switch.arm(reason, operator, at=at)
        log.warning("kill switch armed by %s: %s", operator or "unknown", reason)
        return self.kill_switch_state()

    def disarm(self, operator: str) -> dict[str, Any]:
        """Disarm the kill switch."""
        self.kill_switch.disarm()
        log.warning("kill switch disarmed by %s", operator or "unknown")
        return self.kill_switch_state()

    def kill_switch_state(self) -> dict[str, Any]:
        """`{armed, reason, operator, armedAt}`."""
        switch = self.kill_switch
        armed_at = switch.armed_at
        return {
            "armed": switch.armed,
            "reason": switch.armed_reason,
            "operator": switch.armed_operator,
            "armedAt": armed_at.isoformat() if armed_at else None,
        }

    # -- decisions -----------------------------------------------------------------------------

    async def _evaluate(self, ring: PolicyRing, context: PolicyContext) -> Evaluation:
        if self.blocking:
            return await asyncio.to_thread(ring.evaluate, context)
        return ring.evaluate(context)

    async def admit(self, request: AdmitRequest) -> Judged:
        """A run's admission; an admitted run holds its concurrency slot until its end is settled."""
        context = admission_context(request)
        if self._limits_concurrency:
            self._give_back(request.run_id)  # a redelivered run is admitted again: one slot per run
        ring = self.ring
        evaluation = await self._evaluate(ring, context)
        holds = self._limits_concurrency and evaluation.allowed
        if holds:
            self._hold(request.run_id, evaluation.context)
        else:
            # Refused by a later policy: the limits that passed it give their slots back at once.
            for policy in slots_taken(ring, evaluation):
                policy.release(evaluation.context)
        return context, evaluation, counts_of(ring, evaluation, holds_slot=holds)

    async def check_tool(self, request: CheckToolCallRequest) -> Judged:
        """A tool call's check."""
        context = tool_context(request)
        ring = self.ring
        evaluation = await self._evaluate(ring, context)
        return context, evaluation, counts_of(ring, evaluation, holds_slot=False)

    async def check_output(self, request: CheckOutputRequest) -> Judged:
        """An answer's check (the kill switch stops new work, not answers already streaming)."""
        context = output_context(request)
        ring = self._answer_ring
        evaluation = await self._evaluate(ring, context)
        return context, evaluation, counts_of(ring, evaluation, holds_slot=False)

    def observe(self, run_id: str, counts: DecisionCounts, *, age: float) -> None:
        """Count what another replica counted for a decision `age` seconds ago (by this replica's clock).

        A run's slot is held from then until its end is settled, or `slot_ttl` after it was admitted.
        """
        observe(self.ring.policies, counts, age=age)  # the admission ring holds every policy
        if counts.holds_slot and self._limits_concurrency and age < self._slot_ttl:
            self._give_back(run_id)
            context = counted_context(counts, Phase.PRE_ADMISSION)
            for policy in self.ring.policies:
                if isinstance(policy, ConcurrencyLimitPolicy):
                    policy.observe(context)
            self._hold(run_id, context, since=self._clock() - max(age, 0.0))

    async def check(self, body: dict[str, Any]) -> dict[str, Any]:
        """MS `/check` over the policies in force."""
        if self.blocking:
            return await asyncio.to_thread(check_request, self.ring, body)
        return check_request(self.ring, body)

    def price(self, report: RunEndedReport) -> tuple[str, Charge]:
        """A run's tenant and what it cost by the pricing table (accounted once its end is settled)."""
        tenant = report.principal.tenant or DEFAULT_TENANT
        charge = self.pricing.charge(report.usage, default_model=report.model)
        if charge.unpriced_models and report.run_id not in self._ended:
            log.warning("run %s: no price for %s; counted as free", report.run_id, ", ".join(charge.unpriced_models))
        return tenant, charge

    def settle(self, run_id: str) -> None:
        """A run ended: give back its concurrency slot (once; a repeated end changes nothing)."""
        self._give_back(run_id)

    def account(self, run_id: str, tenant: str, usd: float) -> None:
        """Add a run's cost to its tenant's spend, once per run id (a repeated report changes nothing)."""
        if run_id in self._ended:
            return
        self._ended[run_id] = None
        while len(self._ended) > MAX_HELD_RUNS:
            self._ended.popitem(last=False)
        self._add_spend(tenant, usd)

    def restore_spend(self, spend: Mapping[str, float]) -> None:
        """Take up the spend a previous governance accounted (the ledger's, within the window)."""
        for tenant, usd in spend.items():
            self._add_spend(tenant, usd)

    def _add_spend(self, tenant: str, usd: float) -> None:
        if usd > 0:
            self.spend[tenant] = self.spend.get(tenant, 0.0) + usd
            for ceiling in self._cost_ceilings:
                ceiling.add_cost(tenant, usd)

    def _hold(self, run_id: str, context: PolicyContext, *, since: float | None = None) -> None:
        self._expire()
        self._held[run_id] = _Held(context, self._clock() if since is None else since)
        while len(self._held) > MAX_HELD_RUNS:
            _, oldest = self._held.popitem(last=False)
            self.ring.release(oldest.context)

    def _give_back(self, run_id: str) -> None:
        held = self._held.pop(run_id, None)
        if held is not None:
            self.ring.release(held.context)

    def _expire(self) -> None:
        """Slots of runs never reported ended (their dispatch died) come back after `slot_ttl`."""
        cutoff = self._clock() - self._slot_ttl
        while self._held:
            run_id, held = next(iter(self._held.items()))
            if held.since > cutoff:
                break
            log.warning("run %s never reported its end; its concurrency slot is given back", run_id)
            self._give_back(run_id)

    @property
    def held_slots(self) -> int:
        """Admitted runs holding a concurrency slot now."""
        return len(self._held)

    # -- what the admin surface shows ----------------------------------------------------------

    def identities(self) -> list[dict[str, Any]]:
        """The policies in force, for the runtime info."""
        return [dataclasses.asdict(policy.identity) for policy in self.policies]

    def policies_view(self) -> list[dict[str, Any]]:
        """`GET /policies`: each policy's identity and what it is (§9.4)."""
        rows = [self._view(self.kill_switch)]
        rows.extend(self._view(policy) for policy in self.policies)
        return rows

    def _view(self, policy: Policy) -> dict[str, Any]:
        target = _unwrapped(policy)
        identity = policy.identity
        row: dict[str, Any] = {
            "name": identity.name,
            "source": identity.source,
            "version": identity.version,
            "digest": identity.digest,
            "className": f"{type(target).__module__}.{type(target).__qualname__}",
        }
        if isinstance(policy, DryRunPolicy):
            counts = policy.counts
            row.update(
                dryRun=True,
                wrappedPolicyName=identity.name,
                shadowAdmits=counts.admits,
                shadowDenies=counts.denies,
                shadowTransforms=counts.transforms,
                shadowPrefers=counts.prefers,
                delegateErrors=counts.errors,
            )
        if isinstance(target, KillSwitch):
            state = self.kill_switch_state() if target is self.kill_switch else None
            row.update(
                armed=target.armed,
                armedReason=target.armed_reason,
                armedAt=state["armedAt"] if state else None,
            )
        return row

    def summary(self) -> dict[str, Any]:
        """`GET /summary`: how many policies, from which sources, and the spend accounted."""
        sources = sorted({policy.identity.source for policy in self.policies})
        return {
            "policyCount": len(self.policies),
            "sources": sources,
            "killSwitchArmed": self.kill_switch.armed,
            "judgesOutput": self.judges_output,
            "heldConcurrencySlots": self.held_slots,
            "spendUsdByTenant": {tenant: round(usd, 6) for tenant, usd in sorted(self.spend.items())},
            "pricedModels": len(self.pricing),
        }

    def health(self) -> dict[str, Any]:
        """`GET /health`."""
        return {
            "status": "UP",
            "policyCount": len(self.policies),
            "killSwitch": self.kill_switch_state(),
            "checkedAt": datetime.now(UTC).isoformat(),
        }
