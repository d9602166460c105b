"""`eval`'s availability as the runtime-truth reports print it (`probe` in `pool` finds it out)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EvalAvailability:
    """`eval`'s state: `ACTIVE(mini-racer)`, or `INACTIVE(<reason>)`."""

    active: bool
    reason: str
    """Why it is inactive (`disabled`, `mini-racer not installed`, the worker's own error), or,
    when active, what runs it (`mini-racer 0.14.1 (V8 14.4.258.23)`)."""

    @property
    def label(self) -> str:
        """`ACTIVE(mini-racer)` or `INACTIVE(<reason>)`."""
        return "ACTIVE(mini-racer)" if self.active else f"INACTIVE({self.reason})"
