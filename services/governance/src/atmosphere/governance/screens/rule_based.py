"""The RULE_BASED tier: the regex probes that already screen memory facts, behind the classifier protocol."""

from __future__ import annotations

from atmosphere.governance.injection import Classification, classify
from atmosphere.governance.screens.tiers import Tier

MAX_RULE_SCAN_CHARS = 256 * 1024
"""The longest text the RULE_BASED tier screens here (the tool-output screen's scan bound)."""


class RuleBasedClassifier:
    """The nine probes of `atmosphere.governance.injection.PROBES`; the first that matches wins.

    Every probe window is bounded (`.{0,40}` style, no nested quantifiers), so a scan is linear in
    the text's length; a text over `max_chars` is an ERROR, never a prefix screen.
    """

    def __init__(self, *, max_chars: int = MAX_RULE_SCAN_CHARS) -> None:
        if max_chars <= 0:
            raise ValueError(f"max_chars must be positive, got {max_chars}")
        self._max_chars = max_chars

    @property
    def tier(self) -> Tier:
        """Always `Tier.RULE_BASED`."""
        return Tier.RULE_BASED

    async def classify(self, text: str) -> Classification:
        """Run the probes (synchronously: a 256 KiB scan costs milliseconds, less than a thread hop)."""
        return classify(text, max_chars=self._max_chars)
