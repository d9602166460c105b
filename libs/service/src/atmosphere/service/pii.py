"""Personal data in text: the patterns Atmosphere recognises as PII, and masking them.

Two pattern sets, as the Java original has them:

* `TAPE_PATTERNS` (its `PiiPatterns`): email, US phone, US SSN and credit card (13-19 digits),
  each match replaced by `REDACTED`. The tape's redactor uses them (and a stream filter would).
* `GUARDRAIL_PATTERNS` (its `PiiRedactionGuardrail` defaults): email, phone (international
  too), credit card, US SSN and IPv4, each with a replacement naming its kind
  (`[redacted-email]`, ...) and a kind that a refusal names (`request contains PII of kinds: [..]`).

The patterns are ASCII-only (`re.ASCII`: a digit is 0-9, as in Java) and safe on long input: the
email local part is matched possessively, so a long run of its characters is scanned once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

REDACTED: Final = "[REDACTED]"
"""What the tape pattern set writes over every match."""


@dataclass(frozen=True, slots=True)
class PiiPattern:
    """One kind of personal data: how to find it and what replaces it."""

    kind: str
    """The kind a refusal names, e.g. "email"."""
    regex: re.Pattern[str]
    replacement: str


def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.ASCII)


_EMAIL: Final = _compile(r"(?<![a-zA-Z0-9._%+\-])[a-zA-Z0-9._%+\-]++@[a-zA-Z0-9.\-]+\.[a-zA-Z]{2,}")
_US_PHONE: Final = _compile(r"(?:\+?1[\s.-]?)?\(?\d{3}\)?[\s.-]?\d{3}[\s.-]?\d{4}")
_US_SSN: Final = _compile(r"\b\d{3}-\d{2}-\d{4}\b")
# The original's `\b(?:\d[\s-]?){13,19}\b`, with the separators only between digits: the same
# numbers, without swallowing the space after one.
_CARD_13_TO_19: Final = _compile(r"\b\d(?:[\s-]?\d){12,18}\b")

TAPE_PATTERNS: Final = (
    PiiPattern("email", _EMAIL, REDACTED),
    # Before the phone pattern, which has no word boundary: run first, it would mask ten digits
    # of a card number and leave the rest readable.
    PiiPattern("credit-card", _CARD_13_TO_19, REDACTED),
    PiiPattern("us-ssn", _US_SSN, REDACTED),
    PiiPattern("phone", _US_PHONE, REDACTED),
)
"""Email, credit card, US SSN and US phone, each replaced by `REDACTED` (the tape's set)."""

GUARDRAIL_PATTERNS: Final = (
    # The original's `[A-Za-z0-9._%+-]+@...` scans a long run of local-part characters once per
    # start (seconds on a few hundred kilobytes); `_EMAIL` finds the same addresses in one pass.
    PiiPattern("email", _EMAIL, "[redacted-email]"),
    PiiPattern("phone", _compile(r"\+?\d{1,3}[\s.-]?\(?\d{2,4}\)?[\s.-]?\d{3}[\s.-]?\d{3,4}"), "[redacted-phone]"),
    PiiPattern("credit-card", _compile(r"\b(?:\d{4}[\s-]?){3}\d{1,4}\b"), "[redacted-cc]"),
    PiiPattern("us-ssn", _US_SSN, "[redacted-ssn]"),
    PiiPattern(
        "ipv4",
        _compile(r"\b(?:25[0-5]|2[0-4]\d|[01]?\d?\d)(?:\.(?:25[0-5]|2[0-4]\d|[01]?\d?\d)){3}\b"),
        "[redacted-ip]",
    ),
)
"""The guardrail's defaults, in the order the original applies them (its refusals list kinds so)."""


def kinds_in(text: str, patterns: Iterable[PiiPattern] = GUARDRAIL_PATTERNS) -> list[str]:
    """The kinds of personal data `text` holds, in pattern order (empty: none)."""
    return [p.kind for p in patterns if p.regex.search(text)]


def redact(text: str, patterns: Iterable[PiiPattern] = TAPE_PATTERNS) -> tuple[str, list[str]]:
    """`text` with every match replaced, pattern after pattern, and the kinds that were replaced."""
    kinds: list[str] = []
    for pattern in patterns:
        text, count = pattern.regex.subn(pattern.replacement, text)
        if count:
            kinds.append(pattern.kind)
    return text, kinds


def redact_text(text: str, patterns: Iterable[PiiPattern] = TAPE_PATTERNS) -> str:
    """`text` with every match of `patterns` replaced."""
    return redact(text, patterns)[0]


def redact_value(value: Any, patterns: Iterable[PiiPattern] = TAPE_PATTERNS) -> Any:
    """`value` with every string in it redacted, through nested mappings, lists and tuples.

    Keys and non-string leaves are kept as they are. What holds no match is returned as it was
    (the same object), so a caller can tell cheaply that nothing changed.
    """
    chosen = tuple(patterns)
    if isinstance(value, str):
        redacted = redact_text(value, chosen)
        return value if redacted == value else redacted
    if isinstance(value, Mapping):
        items = {key: redact_value(item, chosen) for key, item in value.items()}
        return value if all(items[k] is value[k] for k in items) else items
    if isinstance(value, list | tuple):
        elements = [redact_value(item, chosen) for item in value]
        if all(new is old for new, old in zip(elements, value, strict=True)):
            return value
        return elements if isinstance(value, list) else tuple(elements)
    return value


__all__ = [
    "GUARDRAIL_PATTERNS",
    "REDACTED",
    "TAPE_PATTERNS",
    "PiiPattern",
    "kinds_in",
    "redact",
    "redact_text",
    "redact_value",
]
