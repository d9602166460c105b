"""The admission policies: required metadata, required roles, and the operator's kill switch."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from atmosphere.governance.policies.model import (
    ADMIT,
    BasePolicy,
    Decision,
    Deny,
    Phase,
    PolicyContext,
    PolicyIdentity,
    java_list,
)

ROLES_METADATA_KEY: Final = "roles"
KILL_SWITCH_NAME: Final = "kill-switch"
"""The conventional name of the one installed kill switch (admin endpoints look it up by it)."""


def _non_blank(values: Sequence[str], message: str) -> tuple[str, ...]:
    kept = tuple(dict.fromkeys(v for v in values if v.strip()))
    if not kept:
        raise ValueError(message)
    return kept


class MetadataPresencePolicy(BasePolicy):
    """Deny a request missing one of the required metadata keys (absent, null or blank)."""

    def __init__(self, identity: PolicyIdentity, required_keys: Sequence[str]) -> None:
        super().__init__(identity)
        self.required_keys = _non_blank(
            required_keys, "metadata-presence requires at least one entry under 'required-keys'"
        )

    def evaluate(self, context: PolicyContext) -> Decision:
        if context.phase is Phase.POST_RESPONSE:
            return ADMIT
        for key in self.required_keys:
            value = context.metadata.get(key)
            if value is None or (isinstance(value, str) and not value.strip()):
                return Deny(f"required metadata key '{key}' is missing")
        return ADMIT


def roles_of(context: PolicyContext) -> tuple[str, ...]:
    """The roles a request claims: metadata `roles`, a collection or a comma-separated string."""
    raw: Any = context.metadata.get(ROLES_METADATA_KEY)
    if raw is None:
        return ()
    items = raw.split(",") if isinstance(raw, str) else raw if isinstance(raw, Collection) else [raw]
    return tuple(dict.fromkeys(text for item in items if item is not None and (text := str(item).strip())))


class AuthorizationPolicy(BasePolicy):
    """Deny a request whose subject does not hold every required role (pre-admission only)."""

    def __init__(self, identity: PolicyIdentity, required_roles: Sequence[str]) -> None:
        super().__init__(identity)
        self.required_roles = _non_blank(
            required_roles, "authorization requires at least one entry under 'required-roles'"
        )

    def evaluate(self, context: PolicyContext) -> Decision:
        if context.phase is Phase.POST_RESPONSE:
            return ADMIT
        held = roles_of(context)
        if not held:
            return Deny(f"no roles claimed by subject; required: {java_list(self.required_roles)}")
        for role in self.required_roles:
            if role not in held:
                return Deny(f"missing required role '{role}' (subject holds: {java_list(held)})")
        return ADMIT


@dataclass(frozen=True)
class ArmedState:
    """Why, by whom and since when the kill switch denies everything."""

    reason: str
    operator: str
    armed_at: datetime


class KillSwitch(BasePolicy):
    """The break-glass switch: while armed, every evaluation is denied with the arm reason."""

    def __init__(
        self,
        identity: PolicyIdentity | None = None,
        *,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        super().__init__(identity or PolicyIdentity.for_code(KILL_SWITCH_NAME, KillSwitch))
        self._now = now
        self._state: ArmedState | None = None
        self._lock = threading.Lock()

    def arm(self, reason: str, operator: str = "unknown", *, at: datetime | None = None) -> None:
        """Deny everything from now on with `reason`; re-arming replaces the reason and the time.

        `at` is when it was armed (default: now), for a switch armed elsewhere and applied here.
        """
        if not reason.strip():
            raise ValueError("reason must not be blank")
        with self._lock:
            self._state = ArmedState(reason, operator.strip() or "unknown", at or self._now())

    def disarm(self) -> None:
        """Let traffic through again (a no-op when not armed)."""
        with self._lock:
            self._state = None

    @property
    def armed(self) -> bool:
        """Whether the switch currently denies."""
        return self._state is not None

    @property
    def armed_reason(self) -> str | None:
        """The reason it was armed with, or None."""
        state = self._state
        return state.reason if state else None

    @property
    def armed_operator(self) -> str | None:
        """Who armed it, or None."""
        state = self._state
        return state.operator if state else None

    @property
    def armed_at(self) -> datetime | None:
        """When it was armed, or None."""
        state = self._state
        return state.armed_at if state else None

    def evaluate(self, context: PolicyContext) -> Decision:
        state = self._state
        return Deny(state.reason) if state else ADMIT
