"""Dry-run: a policy evaluated on live traffic without deciding anything (Atmosphere's `DryRunPolicy`).

The wrapped policy sees every context and its would-be decisions are counted (shadow admits,
denies, transforms, prefers, errors); the wrapper always admits. A new policy can be watched in
production before it is switched on. Its `release` is not passed on: a shadow concurrency
limit never held a real slot.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from atmosphere.governance.policies.model import (
    ADMIT,
    Admit,
    BasePolicy,
    Decision,
    Deny,
    Policy,
    PolicyContext,
    PolicyIdentity,
    Prefer,
    Transform,
)


@dataclass(frozen=True, slots=True)
class ShadowCounts:
    """What the wrapped policy would have decided, so far."""

    admits: int = 0
    denies: int = 0
    transforms: int = 0
    prefers: int = 0
    errors: int = 0


class DryRunPolicy(BasePolicy):
    """Evaluates `wrapped` and counts its decisions; always admits."""

    def __init__(self, wrapped: Policy) -> None:
        super().__init__(wrapped.identity)
        self.wrapped = wrapped
        self._counts = ShadowCounts()
        self._lock = threading.Lock()

    @property
    def counts(self) -> ShadowCounts:
        """The shadow counters."""
        return self._counts

    def evaluate(self, context: PolicyContext) -> Decision:
        """Admit; count what `wrapped` says (a raise counts as an error)."""
        try:
            decision: object = self.wrapped.evaluate(context)
        except Exception:
            decision = None
        with self._lock:
            c = self._counts
            if isinstance(decision, Deny):
                self._counts = ShadowCounts(c.admits, c.denies + 1, c.transforms, c.prefers, c.errors)
            elif isinstance(decision, Transform):
                self._counts = ShadowCounts(c.admits, c.denies, c.transforms + 1, c.prefers, c.errors)
            elif isinstance(decision, Prefer):
                self._counts = ShadowCounts(c.admits, c.denies, c.transforms, c.prefers + 1, c.errors)
            elif isinstance(decision, Admit):
                self._counts = ShadowCounts(c.admits + 1, c.denies, c.transforms, c.prefers, c.errors)
            else:
                self._counts = ShadowCounts(c.admits, c.denies, c.transforms, c.prefers, c.errors + 1)
        return ADMIT

    @property
    def shadow_identity(self) -> PolicyIdentity:
        """The wrapped policy's identity."""
        return self.wrapped.identity
