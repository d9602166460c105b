"""The PII patterns: what each set finds, what replaces it, masking nested values, and long input."""

from __future__ import annotations

import pytest

from atmosphere.service.pii import (
    GUARDRAIL_PATTERNS,
    REDACTED,
    TAPE_PATTERNS,
    kinds_in,
    redact,
    redact_text,
    redact_value,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mail alice.smith+tag@mail.example.co.uk now", f"mail {REDACTED} now"),
        ("call 555-123-4567 or (555) 123 4567 or +1 555.123.4567", f"call {REDACTED} or {REDACTED} or {REDACTED}"),
        ("ssn 123-45-6789.", f"ssn {REDACTED}."),
        ("card 4111 1111 1111 1111 ok", f"card {REDACTED} ok"),
        ("card 4111-1111-1111-1111", f"card {REDACTED}"),
        ("card 378282246310005 (15 digits)", f"card {REDACTED} (15 digits)"),
        ("nothing here: 12-34, v1.2.3, 2024-01-31", "nothing here: 12-34, v1.2.3, 2024-01-31"),
    ],
    ids=["email", "phones", "ssn", "card-spaced", "card-dashed", "card-15", "none"],
)
def test_the_tape_patterns_mask_email_phone_ssn_and_cards(text: str, expected: str) -> None:
    assert redact_text(text) == expected


def test_a_card_is_masked_whole_not_ten_digits_of_it() -> None:
    masked = redact_text("4111111111111111")
    assert masked == REDACTED


def test_the_guardrail_patterns_name_their_kinds_and_replacements() -> None:
    text = "mail bob@example.org from 10.0.0.255, card 4111 1111 1111 1111, ssn 123-45-6789"
    masked, kinds = redact(text, GUARDRAIL_PATTERNS)
    assert "[redacted-email]" in masked
    assert "[redacted-ip]" in masked
    assert "[redacted-ssn]" in masked
    assert "bob@" not in masked
    assert "123-45-6789" not in masked
    assert kinds[0] == "email"
    assert set(kinds) >= {"email", "us-ssn", "ipv4"}
    assert kinds_in("write to +1 (415) 555-0132") == ["phone"]
    assert kinds_in("plain words") == []
    assert [p.kind for p in GUARDRAIL_PATTERNS] == ["email", "phone", "credit-card", "us-ssn", "ipv4"]
    assert [p.kind for p in TAPE_PATTERNS] == ["email", "credit-card", "us-ssn", "phone"]


def test_values_are_masked_through_maps_and_lists_and_kept_when_clean() -> None:
    value = {"to": ["a@example.com", {"cc": "b@example.com"}], "n": 3, "ok": True, "t": ("555-123-4567",)}
    assert redact_value(value) == {"to": [REDACTED, {"cc": REDACTED}], "n": 3, "ok": True, "t": (REDACTED,)}
    clean = {"messages": [{"role": "user", "content": "hello"}], "n": None}
    assert redact_value(clean) is clean


def test_unicode_digits_are_not_ascii_digits() -> None:
    arabic_indic = "٥٥٥-١٢٣-٤٥٦٧"
    assert redact_text(arabic_indic) == arabic_indic


@pytest.mark.parametrize(
    "text",
    ["a" * 200_000, "1" * 200_000, "x@" + "a." * 100_000, "a1-" * 70_000, "1." * 100_000],
    ids=["local-part", "digits", "domain", "mixed", "dotted"],
)
def test_long_hostile_input_is_scanned_in_one_pass(text: str) -> None:
    # A backtracking pattern takes minutes here (the test's timeout fails it); these take milliseconds.
    for patterns in (TAPE_PATTERNS, GUARDRAIL_PATTERNS):
        masked, _ = redact(text, patterns)
        assert isinstance(masked, str)
