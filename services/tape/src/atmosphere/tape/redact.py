"""Masking personal data in what the tape stores (setting `redact`, off by default).

Every string in a step's payload, nested maps and lists included (tool arguments, the input's
messages), has its email addresses, phone, SSN and card numbers replaced by `[REDACTED]`: the
patterns of `atmosphere.service.pii`. Coalesced text is masked as a whole each time it is
written, so a number split over several deltas is still found.
"""

from __future__ import annotations

from typing import Any

from atmosphere.service.pii import TAPE_PATTERNS, redact_text, redact_value

_STRUCTURAL_KEYS = frozenset({"sha256"})
"""Payload fields that are digests, not text: a run of ten digits in one is no phone number."""


class Redactor:
    """Masks payloads when enabled; passes them through untouched otherwise."""

    def __init__(self, *, enabled: bool) -> None:
        """Mask with the tape's PII patterns when `enabled`."""
        self.enabled = enabled

    def payload(self, payload: dict[str, Any]) -> dict[str, Any]:
        """`payload` with its personal data masked (the same object when nothing changed)."""
        if not self.enabled:
            return payload
        masked = {
            key: value if key in _STRUCTURAL_KEYS else redact_value(value, TAPE_PATTERNS)
            for key, value in payload.items()
        }
        return payload if all(masked[k] is payload[k] for k in masked) else masked

    def text(self, text: str) -> str:
        """`text` masked as a payload's string would be."""
        return redact_text(text, TAPE_PATTERNS) if self.enabled else text
