"""The Microsoft Agent Governance Toolkit policy: priority-sorted rules over a context map.

One `MsAgentOsPolicy` per `rules:` document: rules sorted by priority (highest first), the first
whose condition matches decides; none matching falls back to `defaults.action`. The matcher is
MS's `_match_condition`: a field missing from the context never matches; `eq`/`ne` are Python
equality (so `1 == 1.0`); `gt`/`lt`/`gte`/`lte` compare numbers with numbers and like with like
(anything else does not match, where the Java port answered "equal"); `in` is list membership;
`contains` is substring (strings) or membership (collections); `matches` is a regex search.
"""

from __future__ import annotations

import enum
import logging
import operator
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from atmosphere.governance.policies.matching import Searcher
from atmosphere.governance.policies.model import (
    ADMIT,
    BasePolicy,
    Decision,
    Deny,
    PolicyContext,
    PolicyIdentity,
)

_log = logging.getLogger(__name__)


class Operator(enum.StrEnum):
    """A condition's comparison."""

    EQ = "eq"
    NE = "ne"
    GT = "gt"
    LT = "lt"
    GTE = "gte"
    LTE = "lte"
    IN = "in"
    CONTAINS = "contains"
    MATCHES = "matches"


class Action(enum.StrEnum):
    """What a matching rule (or the default) does. `block` is `deny`; `audit` admits and logs."""

    ALLOW = "allow"
    DENY = "deny"
    BLOCK = "block"
    AUDIT = "audit"


@dataclass(frozen=True)
class Rule:
    """One rule: `field <operator> value` → `action`, with a priority and a deny message."""

    name: str
    field: str
    operator: Operator
    value: Any
    action: Action
    priority: int = 0
    message: str = ""
    regex: Searcher | None = None
    """The compiled `value`, for `matches` rules."""


def context_map(context: PolicyContext) -> dict[str, Any]:
    """The map rules read: `phase`, the request fields that are set, metadata, and `response`.

    Request fields left empty are absent (the original's null fields), so a metadata entry of
    the same name (e.g. `user_id` in a `/check` body's context) shows through; a set field always
    wins over metadata.
    """
    values: dict[str, Any] = {"phase": context.phase.value}
    for key in ("message", "system_prompt", "model", "user_id", "session_id", "agent_id", "conversation_id"):
        text = getattr(context, key)
        if text:
            values[key] = text
    for key, value in context.metadata.items():
        values.setdefault(str(key), value)
    if context.response:
        values["response"] = context.response
    return values


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float)


def _compare(left: Any, right: Any, test: Callable[[Any, Any], bool]) -> bool:
    if (_is_number(left) and _is_number(right)) or (type(left) is type(right) and isinstance(left, str)):
        return test(left, right)
    return False


def _contains(haystack: Any, needle: Any) -> bool:
    if isinstance(haystack, str):
        return needle is not None and str(needle) in haystack
    if isinstance(haystack, Collection) and not isinstance(haystack, Mapping):
        return needle in haystack
    return False


def _in(actual: Any, target: Any) -> bool:
    return isinstance(target, list) and actual in target


def _regex_search(rule: Rule, actual: Any) -> bool:
    return rule.regex is not None and rule.regex.search(str(actual)) is not None


def _ordered(test: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    return lambda left, right: _compare(left, right, test)


_TESTS: dict[Operator, Callable[[Any, Any], bool]] = {
    Operator.EQ: lambda actual, target: bool(actual == target),
    Operator.NE: lambda actual, target: bool(actual != target),
    Operator.GT: _ordered(operator.gt),
    Operator.LT: _ordered(operator.lt),
    Operator.GTE: _ordered(operator.ge),
    Operator.LTE: _ordered(operator.le),
    Operator.IN: _in,
    Operator.CONTAINS: _contains,
}


def matches(rule: Rule, values: Mapping[str, Any]) -> bool:
    """Whether `rule`'s condition holds on the context map `values`."""
    actual = values.get(rule.field)
    if actual is None:
        return False
    if rule.operator is Operator.MATCHES:
        return _regex_search(rule, actual)
    return _TESTS[rule.operator](actual, rule.value)


class MsAgentOsPolicy(BasePolicy):
    """A Microsoft-schema document as one policy: first matching rule by priority decides."""

    def __init__(self, identity: PolicyIdentity, rules: Sequence[Rule], default_action: Action = Action.ALLOW) -> None:
        super().__init__(identity)
        # sorted() is stable: rules of equal priority keep their document order, as in MS.
        self.rules = tuple(sorted(rules, key=lambda r: -r.priority))
        self.default_action = default_action

    def evaluate(self, context: PolicyContext) -> Decision:
        values = context_map(context)
        for rule in self.rules:
            if matches(rule, values):
                return self._decide(rule.action, rule.message or f"matched rule '{rule.name}'", rule.name)
        return self._decide(self.default_action, f"no rule matched; default action is {self.default_action}", None)

    def _decide(self, action: Action, reason: str, rule: str | None) -> Decision:
        if action in (Action.DENY, Action.BLOCK):
            return Deny(reason)
        if action is Action.AUDIT:
            _log.info("policy %s audit: rule=%s (%s)", self.identity.name, rule or "<default>", reason)
        return ADMIT
