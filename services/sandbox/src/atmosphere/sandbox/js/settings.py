"""`eval`'s settings, named after the original's keys `org.atmosphere.ai.eval.<key>`.

Each key reads as `ATMOSPHERE_AI_EVAL_<KEY>` (dots to underscores, upper-cased), so the
original's camelCase keys keep their spelling: `ATMOSPHERE_AI_EVAL_TIMEOUTMILLIS`; the
snake-case form (`ATMOSPHERE_AI_EVAL_TIMEOUT_MILLIS`) is read too. As in the original, a
non-positive number means "the default" and a number under a key's floor is raised to the floor
(logged); a value that is not a number at all stops the service at start, naming the variable.
"""

from __future__ import annotations

import logging
from typing import Final

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

log = logging.getLogger("atmosphere.sandbox")

MIB: Final = 1024 * 1024

DEFAULT_TIMEOUT_MILLIS: Final = 5000
DEFAULT_MAX_OUTPUT_CHARS: Final = 8000
DEFAULT_MAX_MEMORY_BYTES: Final = 64 * MIB
DEFAULT_INSTRUCTION_BUDGET: Final = 10_000_000
MAX_WORKERS: Final = 2
"""The most worker processes one sandbox keeps (each holds a V8 of its own, ~75 MiB resident)."""

_DEFAULTS_AND_FLOORS: Final[dict[str, tuple[int, int]]] = {
    "timeout_millis": (DEFAULT_TIMEOUT_MILLIS, 100),
    "max_output_chars": (DEFAULT_MAX_OUTPUT_CHARS, 1),
    "max_memory_bytes": (DEFAULT_MAX_MEMORY_BYTES, 8 * MIB),
    "instruction_budget": (DEFAULT_INSTRUCTION_BUDGET, 1000),
}


class EvalSettings(BaseSettings):
    """`ATMOSPHERE_AI_EVAL_*`: whether `eval` is offered and the bounds of one evaluation."""

    model_config = SettingsConfigDict(
        env_prefix="ATMOSPHERE_AI_EVAL_",
        # The prefix applies to the camelCase aliases as well, and the field names stay readable too.
        env_prefix_target="all",
        populate_by_name=True,
        frozen=True,
        extra="ignore",
        use_attribute_docstrings=True,
    )

    enabled: bool = False
    """Offer the `eval` tool (pure JavaScript in V8; default off, as in the original)."""
    timeout_millis: int = Field(default=DEFAULT_TIMEOUT_MILLIS, alias="timeoutMillis")
    """Wall-clock milliseconds one evaluation may run (floor 100), promises it returns included."""
    max_output_chars: int = Field(default=DEFAULT_MAX_OUTPUT_CHARS, alias="maxOutputChars")
    """Characters (UTF-16 units, like the original's Java strings) of the result kept (floor 1);
    a longer one is cut and ends with `\\n…(output truncated)`."""
    max_memory_bytes: int = Field(default=DEFAULT_MAX_MEMORY_BYTES, alias="maxMemoryBytes")
    """Our addition: the V8 heap one evaluation may use, in bytes (floor 8 MiB); past it the
    evaluation ends with `Error: eval ran out of memory`. Memory outside the heap (ArrayBuffers)
    is bounded by the worker process's data limit (this plus a margin)."""
    workers: int = Field(default=1)
    """Worker processes evaluating at once (1 or 2); more calls wait for a free one."""
    instruction_budget: int = Field(default=DEFAULT_INSTRUCTION_BUDGET, alias="instructionBudget")
    """Read so that configurations written for the original still parse, but NOT enforced: V8 has
    no instruction counter (the original ran Rhino interpreted to count instructions). Here the
    wall-clock `timeoutMillis` and the heap limit are what bound the work of one evaluation."""

    @field_validator("timeout_millis", "max_output_chars", "max_memory_bytes", "instruction_budget")
    @classmethod
    def _default_or_floor(cls, value: int, info: ValidationInfo) -> int:
        default, floor = _DEFAULTS_AND_FLOORS[str(info.field_name)]
        if value <= 0:
            return default
        if value < floor:
            log.warning("raising eval %s=%d to its floor %d", info.field_name, value, floor)
            return floor
        return value

    @field_validator("workers")
    @classmethod
    def _worker_count(cls, value: int) -> int:
        if value <= 0:
            return 1
        if value > MAX_WORKERS:
            log.warning("capping eval workers=%d to %d", value, MAX_WORKERS)
            return MAX_WORKERS
        return value

    @property
    def timeout_seconds(self) -> float:
        """`timeout_millis` in seconds."""
        return self.timeout_millis / 1000
