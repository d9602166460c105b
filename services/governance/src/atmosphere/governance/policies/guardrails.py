"""The guardrail-backed policies: PII redaction, the per-tenant cost ceiling, output-length drift.

In the original these are `AiGuardrail`s wrapped by `GuardrailAsPolicy`; built from code their
identity is the class (`code:<qualname>`, version `embedded`), from YAML the entry's. The tenant is
the request's `tenant` metadata entry, else `__default__` (the original's MDC key
`business.tenant.id`); at most 10,000 tenants are tracked, the rest share the default bucket.
"""

from __future__ import annotations

import enum
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Final

from atmosphere.governance.policies.model import (
    ADMIT,
    DEFAULT_TENANT,
    PARTIAL_METADATA_KEY,
    BasePolicy,
    Decision,
    Deny,
    Phase,
    PolicyContext,
    PolicyIdentity,
    Transform,
    java_list,
)
from atmosphere.service.pii import GUARDRAIL_PATTERNS, kinds_in, redact

MAX_TRACKED_TENANTS: Final = 10_000
COST_WINDOW_SECONDS: Final = 30 * 24 * 3600.0
"""Spend rolls over after this long (the original's 30 days)."""


def _guardrail_identity(kind: type, identity: PolicyIdentity | None) -> PolicyIdentity:
    return identity or PolicyIdentity.for_code(kind.__name__, kind, "embedded")


class PiiMode(enum.StrEnum):
    """What a PII hit in a request does: rewrite it, or refuse the request."""

    REDACT = "redact"
    BLOCK = "block"


class PiiRedactionPolicy(BasePolicy):
    """PII in a request is redacted (or refused in block mode); PII in an answer is refused."""

    def __init__(self, identity: PolicyIdentity | None = None, mode: PiiMode = PiiMode.REDACT) -> None:
        super().__init__(_guardrail_identity(PiiRedactionPolicy, identity))
        self.mode = mode

    def evaluate(self, context: PolicyContext) -> Decision:
        if context.phase is Phase.POST_RESPONSE:
            found = kinds_in(context.response)
            return Deny(f"response contains PII of kinds: {java_list(found)}") if found else ADMIT
        if self.mode is PiiMode.BLOCK:
            found = kinds_in(context.message)
            return Deny(f"request contains PII of kinds: {java_list(found)}") if found else ADMIT
        redacted, found = redact(context.message, GUARDRAIL_PATTERNS)
        return Transform(context.with_message(redacted)) if found else ADMIT


class _TenantBuckets:
    """Tenant keys with a cap: past it, new tenants share the default bucket."""

    def __init__(self, cap: int) -> None:
        self.cap = cap

    def key(self, table: Mapping[str, object], tenant: str) -> str:
        """The bucket `tenant` is accounted in, given the buckets `table` already holds."""
        name = tenant.strip() or DEFAULT_TENANT
        if name == DEFAULT_TENANT or name in table or len(table) < self.cap:
            return name
        return DEFAULT_TENANT


class CostCeilingPolicy(BasePolicy):
    """Refuse a tenant's request once its spend in the rolling window reaches the budget.

    `add_cost` is fed by cost accounting after each model call. A budget of 0 disables the check.
    """

    def __init__(
        self,
        identity: PolicyIdentity | None = None,
        budget_usd: float = 0.0,
        *,
        window_seconds: float = COST_WINDOW_SECONDS,
        max_tenants: int = MAX_TRACKED_TENANTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not math.isfinite(budget_usd) or budget_usd < 0:
            raise ValueError(f"cost-ceiling 'budget-usd' must be a number >= 0, got {budget_usd}")
        super().__init__(_guardrail_identity(CostCeilingPolicy, identity))
        self.budget_usd = float(budget_usd)
        self.window_seconds = window_seconds
        self._buckets = _TenantBuckets(max_tenants)
        self._clock = clock
        self._spent: dict[str, float] = {}
        self._window_start = clock()
        self._lock = threading.Lock()

    def _roll_over(self) -> None:
        now = self._clock()
        if now - self._window_start > self.window_seconds:
            self._spent.clear()
            self._window_start = now

    def add_cost(self, tenant: str, usd: float) -> None:
        """Account `usd` to `tenant` (ignored unless positive and finite)."""
        if not math.isfinite(usd) or usd <= 0:
            return
        with self._lock:
            self._roll_over()
            key = self._buckets.key(self._spent, tenant)
            self._spent[key] = self._spent.get(key, 0.0) + usd

    def spent(self, tenant: str) -> float:
        """What `tenant` has spent in the current window."""
        with self._lock:
            self._roll_over()
            return self._spent.get(tenant.strip() or DEFAULT_TENANT, 0.0)

    @property
    def tracked_tenants(self) -> int:
        """Distinct tenant buckets held (at most the cap)."""
        return len(self._spent)

    def evaluate(self, context: PolicyContext) -> Decision:
        if context.phase is Phase.POST_RESPONSE or self.budget_usd == 0:
            return ADMIT
        with self._lock:
            self._roll_over()
            tenant = self._buckets.key(self._spent, context.tenant)
            spent = self._spent.get(tenant, 0.0)
        if spent >= self.budget_usd:
            return Deny(f"cost ceiling reached for tenant {tenant} (spent {spent:.4f} of budget {self.budget_usd!r})")
        return ADMIT


class OutputLengthZScorePolicy(BasePolicy):
    """Refuse an answer whose length is more than `z_threshold` deviations from its tenant's recent mean.

    Post-response only. The first `min_samples` lengths only build the baseline; after that each
    length is judged against the window (population std-dev, 1.0 when the variance is not
    positive) and then added to it. Only whole answers are judged and sampled: a check of a
    streamed answer's prefix (context metadata `partial`) admits without adding its length, unlike
    Atmosphere, whose partial lengths skew the window towards short answers.
    """

    def __init__(
        self,
        identity: PolicyIdentity | None = None,
        window_size: int = 50,
        z_threshold: float = 3.0,
        min_samples: int = 10,
        *,
        max_tenants: int = MAX_TRACKED_TENANTS,
    ) -> None:
        if window_size < 2:
            raise ValueError("output-length-zscore 'window-size' must be >= 2")
        if not math.isfinite(z_threshold) or z_threshold <= 0:
            raise ValueError("output-length-zscore 'z-threshold' must be > 0")
        if min_samples < 2:
            raise ValueError("output-length-zscore 'min-samples' must be >= 2")
        super().__init__(_guardrail_identity(OutputLengthZScorePolicy, identity))
        self.window_size, self.z_threshold, self.min_samples = window_size, float(z_threshold), min_samples
        self._buckets = _TenantBuckets(max_tenants)
        self._windows: dict[str, deque[int]] = {}
        self._lock = threading.Lock()

    def evaluate(self, context: PolicyContext) -> Decision:
        if context.phase is Phase.PRE_ADMISSION or context.metadata.get(PARTIAL_METADATA_KEY):
            return ADMIT
        length = context.response_length
        with self._lock:
            tenant = self._buckets.key(self._windows, context.tenant)
            window = self._windows.setdefault(tenant, deque())
            if len(window) < self.min_samples:
                window.append(length)
                return ADMIT
            z = self._z_score(window, length)
            window.append(length)
            while len(window) > self.window_size:
                window.popleft()
        if z > self.z_threshold:
            return Deny(
                f"response length z-score {z:.2f} exceeds threshold {self.z_threshold!r} "
                f"(tenant={tenant}, possible drift)"
            )
        return ADMIT

    def observe(self, context: PolicyContext) -> None:
        """Add the length of a whole answer another replica judged to its tenant's window."""
        if context.phase is Phase.PRE_ADMISSION or context.metadata.get(PARTIAL_METADATA_KEY):
            return
        with self._lock:
            window = self._windows.setdefault(self._buckets.key(self._windows, context.tenant), deque())
            window.append(context.response_length)
            while len(window) > self.window_size:
                window.popleft()

    def samples(self, tenant: str) -> tuple[int, ...]:
        """The answer lengths in `tenant`'s window now, oldest first."""
        with self._lock:
            return tuple(self._windows.get(tenant.strip() or DEFAULT_TENANT, ()))

    @staticmethod
    def _z_score(window: deque[int], length: int) -> float:
        n = len(window)
        mean = sum(window) / n
        variance = sum(v * v for v in window) / n - mean * mean
        std = math.sqrt(variance) if variance > 0 else 1.0
        return abs(length - mean) / std
