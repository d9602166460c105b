"""Composing policies: Atmosphere's `PolicyRing` (admission) and the `/check` walk.

Order: the ring keeps the order it is given. Atmosphere's rings are operator-numbered
"cheapest first" tiers; we have no cost model, so the caller's order (built-ins and files in the
order they are listed, then code-registered policies) is the evaluation order.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from atmosphere.governance.policies.model import (
    ADMIT,
    Admit,
    Decision,
    Deny,
    Policy,
    PolicyContext,
    PolicyIdentity,
    Prefer,
    Transform,
)


@dataclass(frozen=True)
class Evaluation:
    """The outcome of a ring: the decision, the policy that made it, the context it ends with."""

    decision: Decision
    policy: PolicyIdentity | None
    """Who decided; None when nothing but admits (or no policy at all) was seen."""
    context: PolicyContext
    """The context after every transform (what the caller should go on with)."""
    evaluation_ms: float

    @property
    def allowed(self) -> bool:
        """Whether the request may go on (anything but a deny)."""
        return not isinstance(self.decision, Deny)


def _safely(policy: Policy, context: PolicyContext) -> Decision:
    """The policy's decision; a raise is a deny (fail-closed), as at every admission seam."""
    try:
        # Typed as object: a policy written by an app may return anything.
        decision: object = policy.evaluate(context)
    except Exception as exc:
        return Deny(f"policy evaluation failed: {exc}")
    if not isinstance(decision, Admit | Transform | Deny | Prefer):
        return Deny(f"policy evaluation failed: {type(decision).__name__} is not a decision")
    return decision


def _elapsed_ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0


class PolicyRing:
    """Policies evaluated in order: the first deny stops, a transform feeds forward, a raise denies.

    A prefer is advice: evaluation goes on, and the first prefer is the ring's answer when no
    policy denied or rewrote. A rewrite is answered as a `Transform` of the final context, named
    after the last policy that rewrote.
    """

    def __init__(self, policies: Sequence[Policy]) -> None:
        self.policies: tuple[Policy, ...] = tuple(policies)

    def evaluate(self, context: PolicyContext) -> Evaluation:
        """The ring's decision on `context` (empty ring: admit, no policy)."""
        started = time.perf_counter()
        current = context
        rewrote: PolicyIdentity | None = None
        first_prefer: tuple[Prefer, PolicyIdentity] | None = None
        for policy in self.policies:
            decision = _safely(policy, current)
            if isinstance(decision, Deny):
                return Evaluation(decision, policy.identity, current, _elapsed_ms(started))
            if isinstance(decision, Transform):
                current, rewrote = decision.context, policy.identity
            elif isinstance(decision, Prefer) and first_prefer is None:
                first_prefer = (decision, policy.identity)
        if rewrote is not None:
            return Evaluation(Transform(current), rewrote, current, _elapsed_ms(started))
        if first_prefer is not None:
            return Evaluation(first_prefer[0], first_prefer[1], current, _elapsed_ms(started))
        return Evaluation(ADMIT, None, current, _elapsed_ms(started))

    def check(self, context: PolicyContext) -> Evaluation:
        """The `/check` walk (§9.4): every policy sees `context` itself; the first deny stops.

        A transform or prefer is recorded as the match (a later one replaces it) and evaluation
        goes on; rewrites are not fed forward, as in Atmosphere's `GovernanceController.check`.
        """
        started = time.perf_counter()
        matched: tuple[Decision, PolicyIdentity] | None = None
        for policy in self.policies:
            decision = _safely(policy, context)
            if isinstance(decision, Deny):
                return Evaluation(decision, policy.identity, context, _elapsed_ms(started))
            if isinstance(decision, Transform | Prefer):
                matched = (decision, policy.identity)
        if matched is None:
            return Evaluation(ADMIT, None, context, _elapsed_ms(started))
        decision, identity = matched
        final = decision.context if isinstance(decision, Transform) else context
        return Evaluation(decision, identity, final, _elapsed_ms(started))

    def release(self, context: PolicyContext) -> None:
        """Let every policy give back what the admitted request held; a failing hook is skipped."""
        for policy in self.policies:
            try:
                policy.release(context)
            except Exception:  # noqa: S112 - one policy's bookkeeping must not stop the others
                continue
