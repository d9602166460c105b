"""Per-request policies: the tool loop cap, provider retries, and budgets."""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar

from atmosphere.sdk.errors import UserError


class OnMaxIterations(Enum):
    """What happens when the model still asks for tools after the last allowed round."""

    COMPLETE_WITHOUT_TOOLS = "complete_without_tools"
    """Ask the model once more with no tools offered, and finish with its answer."""
    FAIL = "fail"
    """End the run with `Tool loop exhausted after N iterations`."""


@dataclass(frozen=True, slots=True)
class ToolLoopPolicy:
    """How many model → tools → model rounds a run may take (default: 5, then answer)."""

    cap: int = 5
    """The most tool rounds."""
    on_max_iterations: OnMaxIterations = OnMaxIterations.COMPLETE_WITHOUT_TOOLS

    DEFAULT: ClassVar[ToolLoopPolicy]

    def __post_init__(self) -> None:
        if self.cap < 1:
            msg = "a tool loop needs at least 1 iteration"
            raise UserError(msg)

    @classmethod
    def strict(cls, n: int) -> ToolLoopPolicy:
        """At most `n` rounds; one more tool request ends the run with an error."""
        return cls(n, OnMaxIterations.FAIL)

    @classmethod
    def max_iterations(cls, n: int) -> ToolLoopPolicy:
        """At most `n` rounds; then the model must answer without tools."""
        return cls(n, OnMaxIterations.COMPLETE_WITHOUT_TOOLS)


ToolLoopPolicy.DEFAULT = ToolLoopPolicy()


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retries of a provider call that failed before any text of its round reached the client.

    Retried: connection errors, 408, 429 and 5xx. A `Retry-After` header wins over the
    computed delay. The delay is `min(initial * multiplier**attempt, max)` plus up to 25 %
    jitter.
    """

    max_retries: int = 3
    initial_delay: float = 1.0
    max_delay: float = 30.0
    multiplier: float = 2.0

    DEFAULT: ClassVar[RetryPolicy]
    NONE: ClassVar[RetryPolicy]

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.initial_delay < 0 or self.max_delay < 0 or self.multiplier < 1:
            msg = "RetryPolicy needs max_retries >= 0, non-negative delays and multiplier >= 1"
            raise UserError(msg)

    def delay(self, attempt: int, *, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number `attempt` (0-based)."""
        if retry_after is not None:
            return min(max(0.0, retry_after), self.max_delay)
        base = min(self.initial_delay * self.multiplier**attempt, self.max_delay)
        return base + random.uniform(0, base * 0.25)  # noqa: S311 - jitter, not cryptography


RetryPolicy.DEFAULT = RetryPolicy()
RetryPolicy.NONE = RetryPolicy(max_retries=0)


class BudgetReason(Enum):
    """Which limit a budget breach crossed (the error text names it)."""

    INPUT_TOKENS = ("INPUT_TOKENS", "tokens")
    OUTPUT_TOKENS = ("OUTPUT_TOKENS", "tokens")
    TOTAL_TOKENS = ("TOTAL_TOKENS", "tokens")
    STEPS = ("STEPS", "steps")
    WALL_CLOCK = ("WALL_CLOCK", "ms")


@dataclass(frozen=True, slots=True)
class AiBudget:
    """Limits of one run; `None` leaves a dimension unenforced.

    Usage is counted from the runtime's usage reports (one step per report); the first limit
    crossed ends the run with one error frame and cancels the model call.
    """

    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    max_total_tokens: int | None = None
    max_steps: int | None = None
    max_wall_clock: float | None = None
    """Seconds."""

    @property
    def enforced(self) -> bool:
        """Whether any dimension is limited."""
        return any(
            v is not None and v > 0
            for v in (
                self.max_input_tokens,
                self.max_output_tokens,
                self.max_total_tokens,
                self.max_steps,
                self.max_wall_clock,
            )
        )
