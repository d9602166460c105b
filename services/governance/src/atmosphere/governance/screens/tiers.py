"""What every prompt-injection classifier tier is: a name, and an async `classify` that never raises."""

from __future__ import annotations

from enum import Enum
from typing import Protocol, runtime_checkable

from atmosphere.governance.injection import Classification


class Tier(Enum):
    """The classifier tiers, by the names the configuration uses."""

    RULE_BASED = "RULE_BASED"
    """The nine regex probes of `atmosphere.governance.injection`: no dependencies, microseconds."""
    EMBEDDING_SIMILARITY = "EMBEDDING_SIMILARITY"
    """Cosine similarity of the text's chunks to embedded attack exemplars (an offline ONNX model)."""
    LLM_CLASSIFIER = "LLM_CLASSIFIER"
    """A one-word verdict from an OpenAI-compatible chat completions endpoint."""

    @classmethod
    def parse(cls, name: str) -> Tier:
        """The tier called `name` (case and surrounding blanks ignored); a clear error otherwise."""
        try:
            return cls(name.strip().upper())
        except ValueError:
            names = ", ".join(tier.value for tier in cls)
            raise ValueError(f"unknown injection classifier tier {name!r}: expected one of {names}") from None


class TierUnavailable(Exception):  # noqa: N818 - a state to report ("INACTIVE: <reason>"), not a bug
    """A tier cannot run here (its package is missing, or it lacks configuration).

    Governance reports the screen INACTIVE with `reason`, or refuses to start: it never silently
    screens with less than it was asked to.
    """

    def __init__(self, tier: Tier, reason: str) -> None:
        super().__init__(f"{tier.value} is unavailable: {reason}")
        self.tier = tier
        self.reason = reason


class EmbeddingUnavailable(TierUnavailable):
    """The EMBEDDING_SIMILARITY tier's model or runtime is not installed (or fails its integrity check)."""

    def __init__(self, reason: str) -> None:
        super().__init__(Tier.EMBEDDING_SIMILARITY, reason)


@runtime_checkable
class InjectionClassifier(Protocol):
    """One tier of the prompt-injection screen.

    `classify` returns SAFE, INJECTED or ERROR with a reason, the probe (or nearest attack
    exemplar) and a confidence. It does not raise: a failure is an ERROR, and what an ERROR means
    (drop, withhold, pass) is the caller's breach policy.
    """

    @property
    def tier(self) -> Tier:
        """The tier this classifier implements (for a layered one, its deepest layer)."""
        ...

    async def classify(self, text: str) -> Classification:
        """Classify one text."""
        ...
