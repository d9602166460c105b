"""What the stateful policies counted for one decision, and counting the same on another replica.

Rate limits, concurrency limits and output-length windows count the requests they judge. With N
governance replicas, the replica that takes a request decides with its own counters, and logs
what they counted beside the decision (`DecisionCounts`); every other replica counts the same
when it applies the decision (`observe`), so the counters of each replica see the requests of all.

A policy is matched by its identity digest (name, source, version and definition): a replica
running other policies (mid-rollout) counts only for the policies it shares. A dry-run policy's
shadow counters are not shared (they decide nothing), nor is the state of an app's own Python
policies (governance cannot know what they keep).
"""

from __future__ import annotations

from collections.abc import Iterable

from atmosphere.contracts.governance.v1.governance_pb2 import DecisionCounts
from atmosphere.governance.policies import (
    ConcurrencyLimitPolicy,
    Evaluation,
    OutputLengthZScorePolicy,
    Phase,
    Policy,
    PolicyContext,
    PolicyRing,
    RateLimitPolicy,
)
from atmosphere.governance.policies.model import (
    PARTIAL_METADATA_KEY,
    RESPONSE_CHARS_METADATA_KEY,
    TENANT_METADATA_KEY,
)


def judged(ring: PolicyRing, evaluation: Evaluation) -> tuple[tuple[Policy, ...], Policy | None]:
    """The policies of `ring` that let the request pass, and the one that denied it (None: none did).

    A ring stops at its first deny: the policies after it never saw the request.
    """
    if evaluation.allowed:
        return ring.policies, None
    for index, policy in enumerate(ring.policies):
        if policy.identity is evaluation.policy:
            return ring.policies[:index], policy
    return (), None


def slots_taken(ring: PolicyRing, evaluation: Evaluation) -> list[ConcurrencyLimitPolicy]:
    """The concurrency limits that gave the request a slot (each gives it back on `release`)."""
    passed, _ = judged(ring, evaluation)
    return [policy for policy in passed if isinstance(policy, ConcurrencyLimitPolicy)]


def counts_of(ring: PolicyRing, evaluation: Evaluation, *, holds_slot: bool) -> DecisionCounts | None:
    """What the stateful policies of `ring` counted for `evaluation` (None: nothing).

    `holds_slot`: the request is an admitted run, holding a concurrency slot until it ends.
    """
    passed, denier = judged(ring, evaluation)
    context = evaluation.context
    rate_limits: list[str] = []
    if context.phase is Phase.PRE_ADMISSION:
        # A rate limit counts what it admits; the one that denied counted nothing.
        rate_limits = [p.identity.digest for p in passed if isinstance(p, RateLimitPolicy)]
    lengths: list[str] = []
    if context.phase is Phase.POST_RESPONSE and not context.metadata.get(PARTIAL_METADATA_KEY):
        # An output-length policy adds every whole answer it judges to its window, also one it refuses.
        judging = [*passed, denier] if denier is not None else passed
        lengths = [p.identity.digest for p in judging if isinstance(p, OutputLengthZScorePolicy)]
    if not (rate_limits or lengths or holds_slot):
        return None
    return DecisionCounts(
        user_id=context.user_id,
        session_id=context.session_id,
        tenant=context.tenant,
        rate_limits=rate_limits,
        holds_slot=holds_slot,
        length_samples=lengths,
        response_chars=context.response_length if lengths else 0,
    )


def counted_context(counts: DecisionCounts, phase: Phase) -> PolicyContext:
    """The request as the counting policies see it: who it was, its tenant, its answer's length."""
    metadata: dict[str, object] = {TENANT_METADATA_KEY: counts.tenant}
    if phase is Phase.POST_RESPONSE:
        metadata[RESPONSE_CHARS_METADATA_KEY] = counts.response_chars
    return PolicyContext(phase=phase, user_id=counts.user_id, session_id=counts.session_id, metadata=metadata)


def observe(policies: Iterable[Policy], counts: DecisionCounts, *, age: float) -> None:
    """Count in `policies` the rate-limit hits and answer lengths another replica counted `age` seconds ago.

    Concurrency slots are the plane's to take (it holds them until the run ends).
    """
    rate_limits, lengths = set(counts.rate_limits), set(counts.length_samples)
    request = counted_context(counts, Phase.PRE_ADMISSION)
    answer = counted_context(counts, Phase.POST_RESPONSE)
    for policy in policies:
        digest = policy.identity.digest
        if isinstance(policy, RateLimitPolicy) and digest in rate_limits:
            policy.observe(request, age=age)
        elif isinstance(policy, OutputLengthZScorePolicy) and digest in lengths:
            policy.observe(answer)
