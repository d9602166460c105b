"""Operators' regexes run on RE2: a crafted message cannot stall governance; syntax RE2 lacks is refused at start."""

from __future__ import annotations

import pytest

from atmosphere.governance.policies import Deny, Phase, PolicyContext, PolicyFileError, parse_policies

CATASTROPHIC = ["(a+)+$", "(a|aa)+$", "(.*a){12}$", "^(([a-z])+.)+[A-Z]([a-z])+$"]
"""Patterns that take a backtracking engine exponential time on a near-miss."""


@pytest.mark.parametrize("pattern", CATASTROPHIC)
def test_a_catastrophic_pattern_meets_a_crafted_message_in_one_pass(pattern: str) -> None:
    document = f"policies:\n  - name: strict\n    type: deny-list\n    config:\n      regex: ['{pattern}']\n"
    (policy,) = parse_policies(document, source="yaml:p")
    near_miss = "a" * 200_000 + "!"  # Python's `re` would not finish this in the life of the test run
    assert not isinstance(policy.evaluate(PolicyContext(phase=Phase.PRE_ADMISSION, message=near_miss)), Deny)
    assert isinstance(policy.evaluate(PolicyContext(phase=Phase.PRE_ADMISSION, message="a" * 20)), Deny)


def test_an_ms_matches_rule_is_linear_too() -> None:
    document = (
        "rules:\n  - name: r\n    condition: {field: message, operator: matches, value: '(x+x+)+y'}\n    action: deny\n"
    )
    (policy,) = parse_policies(document, source="yaml:ms")
    assert not isinstance(policy.evaluate(PolicyContext(phase=Phase.PRE_ADMISSION, message="x" * 100_000)), Deny)
    assert isinstance(policy.evaluate(PolicyContext(phase=Phase.PRE_ADMISSION, message="xxy")), Deny)


@pytest.mark.parametrize(("pattern", "problem"), [("foo(?=bar)", "lookaround"), (r"(a)\1", "backreferences")])
def test_syntax_re2_cannot_run_is_refused_naming_the_line(pattern: str, problem: str) -> None:
    document = f"policies:\n  - name: p\n    type: deny-list\n    config:\n      regex: ['{pattern}']\n"
    with pytest.raises(PolicyFileError, match=rf"yaml:p:\d+.*invalid regex.*{problem}"):
        parse_policies(document, source="yaml:p")


def test_a_regex_too_large_to_compile_is_refused() -> None:
    document = "policies:\n  - name: p\n    type: deny-list\n    config:\n      regex: ['((a{1000}){1000}){1000}']\n"
    with pytest.raises(PolicyFileError, match="invalid regex"):
        parse_policies(document, source="yaml:p")
