"""Composition (`PolicyRing`), the MS schema's semantics, `/check`, and code-registered policies."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from atmosphere.governance.policies import (
    Admit,
    BasePolicy,
    Decision,
    Deny,
    Phase,
    Policy,
    PolicyContext,
    PolicyIdentity,
    PolicyRing,
    Prefer,
    Transform,
    check_request,
    clear_registered_policies,
    parse_policies,
    register_policy,
    registered_policies,
)


class Fixed(BasePolicy):
    """Answers the same decision every time, and remembers the messages it saw."""

    def __init__(self, name: str, decision: Decision) -> None:
        super().__init__(PolicyIdentity.of(name, "code:test", "1", name))
        self.decision = decision
        self.seen: list[str] = []

    def evaluate(self, context: PolicyContext) -> Decision:
        self.seen.append(context.message)
        return self.decision


class Upper(BasePolicy):
    def __init__(self) -> None:
        super().__init__(PolicyIdentity.of("upper", "code:test", "1", "upper"))

    def evaluate(self, context: PolicyContext) -> Decision:
        return Transform(context.with_message(context.message.upper()))


class Broken(BasePolicy):
    def __init__(self) -> None:
        super().__init__(PolicyIdentity.of("broken", "code:test", "1", "broken"))

    def evaluate(self, context: PolicyContext) -> Decision:
        raise RuntimeError("database unavailable")


def pre(message: str = "hello", **kwargs: Any) -> PolicyContext:
    return PolicyContext(phase=Phase.PRE_ADMISSION, message=message, **kwargs)


# -- ring ------------------------------------------------------------------------------------


def test_empty_ring_admits_with_no_policy() -> None:
    evaluation = PolicyRing([]).evaluate(pre())
    assert evaluation.decision == Admit()
    assert evaluation.policy is None
    assert evaluation.allowed
    assert evaluation.evaluation_ms >= 0


def test_first_deny_stops_in_the_given_order() -> None:
    first, second, third = Fixed("a", Admit()), Fixed("b", Deny("no")), Fixed("c", Deny("never reached"))
    evaluation = PolicyRing([first, second, third]).evaluate(pre())
    assert evaluation.decision == Deny("no")
    assert evaluation.policy == second.identity
    assert not evaluation.allowed
    assert third.seen == []


def test_a_transform_feeds_forward() -> None:
    after = Fixed("after", Admit())
    evaluation = PolicyRing([Upper(), after]).evaluate(pre("quiet"))
    assert after.seen == ["QUIET"]
    assert isinstance(evaluation.decision, Transform)
    assert evaluation.context.message == "QUIET"
    assert evaluation.policy is not None
    assert evaluation.policy.name == "upper"
    assert evaluation.allowed


def test_a_deny_after_a_transform_sees_the_rewrite() -> None:
    deny_list = parse_policies(
        "policies:\n  - {name: d, type: deny-list, config: {phrases: [LOUD]}}\n", source="yaml:x"
    )
    evaluation = PolicyRing([Upper(), *deny_list]).evaluate(pre("loud"))
    assert evaluation.decision == Deny("deny-list: request matched a denied phrase")
    assert evaluation.context.message == "LOUD"


def test_a_raise_is_a_deny() -> None:
    after = Fixed("after", Admit())
    evaluation = PolicyRing([Broken(), after]).evaluate(pre())
    assert evaluation.decision == Deny("policy evaluation failed: database unavailable")
    assert evaluation.policy is not None
    assert evaluation.policy.name == "broken"
    assert after.seen == []


def test_a_non_decision_is_a_deny() -> None:
    odd = Fixed("odd", "yes")  # type: ignore[arg-type]
    assert PolicyRing([odd]).evaluate(pre()).decision == Deny("policy evaluation failed: str is not a decision")


def test_prefer_is_advice_and_the_first_one_is_answered() -> None:
    first, second = Fixed("p1", Prefer("a", "r1")), Fixed("p2", Prefer("b", "r2"))
    after = Fixed("after", Admit())
    evaluation = PolicyRing([first, second, after]).evaluate(pre())
    assert evaluation.decision == Prefer("a", "r1")
    assert evaluation.policy == first.identity
    assert evaluation.allowed
    assert after.seen == ["hello"]
    denied = PolicyRing([first, Fixed("d", Deny("x"))]).evaluate(pre())
    assert denied.decision == Deny("x")


def test_pii_then_deny_list_in_one_ring() -> None:
    policies = parse_policies(
        "policies:\n"
        "  - {name: pii, type: pii-redaction}\n"
        "  - {name: words, type: deny-list, config: {phrases: ['[redacted-email]']}}\n",
        source="yaml:x",
    )
    evaluation = PolicyRing(policies).evaluate(pre("write to a@b.io"))
    assert evaluation.decision == Deny("deny-list: request matched a denied phrase")
    assert evaluation.policy is not None
    assert evaluation.policy.name == "words"


def test_release_reaches_every_policy() -> None:
    (limit,) = parse_policies(
        "policies:\n  - {name: c, type: concurrency-limit, config: {max-concurrent: 1}}\n", source="yaml:x"
    )
    ring = PolicyRing([Broken(), limit])
    context = pre(user_id="u")
    assert limit.evaluate(context) == Admit()
    ring.release(context)
    assert limit.evaluate(context) == Admit()


# -- Microsoft schema ------------------------------------------------------------------------

# Verbatim from the seed README (MS's docs/tutorials/policy-as-code/examples/01_first_policy.yaml).
FIRST_POLICY = """\
version: "1.0"
name: my-first-policy
description: A simple policy that blocks dangerous agent actions
rules:
  - name: block-delete-database
    condition: { field: tool_name, operator: eq, value: delete_database }
    action: deny
    priority: 100
    message: "Deleting databases is not allowed"
defaults: { action: allow }
"""

# The example of the original's YamlPolicyParser javadoc.
PRODUCTION_POLICY = """\
version: "1.0"
name: production-policy
description: Company-wide policy
rules:
  - name: block-delete-database
    condition:
      field: message
      operator: contains
      value: DROP TABLE
    action: deny
    priority: 100
    message: "SQL drop statements are never allowed"
defaults:
  action: allow
"""


def ring_of(*texts: str) -> PolicyRing:
    return PolicyRing([p for i, text in enumerate(texts) for p in parse_policies(text, source=f"yaml:doc{i}.yaml")])


def test_seed_ms_example_through_check() -> None:
    ring = ring_of(FIRST_POLICY)
    denied = check_request(
        ring, {"agent_id": "ops", "action": "call_tool", "context": {"tool_name": "delete_database"}}
    )
    assert denied["allowed"] is False
    assert denied["decision"] == "deny"
    assert denied["reason"] == "Deleting databases is not allowed"
    assert denied["matched_policy"] == "my-first-policy"
    assert denied["matched_source"] == "yaml:doc0.yaml"
    assert isinstance(denied["evaluation_ms"], float)
    allowed = check_request(ring, {"agent_id": "ops", "action": "call_tool", "context": {"tool_name": "read_table"}})
    assert allowed == {
        "allowed": True,
        "decision": "allow",
        "reason": "",
        "matched_policy": None,
        "matched_source": None,
        "evaluation_ms": allowed["evaluation_ms"],
    }


def test_production_example_through_check() -> None:
    ring = ring_of(PRODUCTION_POLICY)
    answer = check_request(ring, {"agent_id": "a", "action": "chat", "context": {"message": "please DROP TABLE x"}})
    assert (answer["allowed"], answer["reason"]) == (False, "SQL drop statements are never allowed")
    assert check_request(ring, {"agent_id": "a", "context": {"message": "drop table x"}})["allowed"] is True


def test_no_policies_allows() -> None:
    answer = check_request(PolicyRing([]), {"agent_id": "a", "action": "x", "context": {}})
    assert answer == {
        "allowed": True,
        "decision": "allow",
        "reason": "",
        "matched_policy": None,
        "matched_source": None,
        "evaluation_ms": answer["evaluation_ms"],
    }


def ms(condition: str, *, action: str = "deny", defaults: str = "allow", message: str = "") -> PolicyRing:
    message_line = f"    message: {message}\n" if message else ""
    rule = f"  - name: r\n    condition: {condition}\n    action: {action}\n{message_line}"
    return ring_of(f"rules:\n{rule}defaults: {{action: {defaults}}}\n")


def decide(ring: PolicyRing, **context: Any) -> dict[str, Any]:
    return check_request(ring, {"agent_id": "agent-7", "action": "act", "context": context})


@pytest.mark.parametrize(
    ("condition", "context", "denied"),
    [
        ("{field: n, operator: eq, value: 1}", {"n": 1.0}, True),  # numeric-aware loose equality
        ("{field: n, operator: eq, value: 1}", {"n": "1"}, False),
        ("{field: n, operator: ne, value: x}", {"n": "y"}, True),
        ("{field: n, operator: ne, value: x}", {}, False),  # a missing field never matches
        ("{field: n, operator: gt, value: 100}", {"n": 150}, True),
        ("{field: n, operator: gt, value: 100}", {"n": 100}, False),
        ("{field: n, operator: gte, value: 100}", {"n": 100.0}, True),
        ("{field: n, operator: lt, value: 0.5}", {"n": 0}, True),
        ("{field: n, operator: lte, value: b}", {"n": "a"}, True),  # strings compare with strings
        ("{field: n, operator: gte, value: 1}", {"n": "zzz"}, False),  # incomparable: no match
        ("{field: n, operator: in, value: [a, b]}", {"n": "b"}, True),
        ("{field: n, operator: in, value: [a, b]}", {"n": "c"}, False),
        ("{field: n, operator: contains, value: sec}", {"n": "top secret"}, True),
        ("{field: n, operator: contains, value: admin}", {"n": ["user", "admin"]}, True),
        ("{field: n, operator: contains, value: admin}", {"n": ["user"]}, False),
        ("{field: n, operator: matches, value: '^rm\\s'}", {"n": "rm -rf /"}, True),
        ("{field: n, operator: matches, value: 'RM'}", {"n": "rm"}, False),  # case-sensitive, as MS
        ("{field: agent_id, operator: eq, value: agent-7}", {}, True),
        ("{field: action, operator: eq, value: act}", {}, True),
        ("{field: phase, operator: eq, value: pre_admission}", {}, True),
        ("{field: message, operator: eq, value: hi}", {"message": "hi"}, True),
    ],
)
def test_ms_operators(condition: str, context: dict[str, Any], denied: bool) -> None:
    assert decide(ms(condition), **context)["allowed"] is not denied


def test_ms_actions_and_messages() -> None:
    assert decide(ms("{field: x, operator: eq, value: 1}"), x=1)["reason"] == "matched rule 'r'"
    assert decide(ms("{field: x, operator: eq, value: 1}", action="block", message="nope"), x=1)["reason"] == "nope"
    assert decide(ms("{field: x, operator: eq, value: 1}", action="audit"), x=1)["allowed"] is True
    assert decide(ms("{field: x, operator: eq, value: 1}", action="allow", defaults="deny"), x=1)["allowed"] is True
    assert decide(ms("{field: x, operator: eq, value: 1}", defaults="deny"), x=2)["reason"] == (
        "no rule matched; default action is deny"
    )
    assert decide(ms("{field: x, operator: eq, value: 1}", defaults="block"), x=2)["reason"] == (
        "no rule matched; default action is block"
    )


def test_ms_priority_decides_first_match() -> None:
    ring = ring_of(
        "rules:\n"
        "  - {name: low, condition: {field: x, operator: eq, value: 1}, action: deny, priority: 1, message: low}\n"
        "  - {name: high, condition: {field: x, operator: eq, value: 1}, action: allow, priority: 10}\n"
        "  - {name: other, condition: {field: x, operator: eq, value: 2}, action: deny, message: other}\n"
    )
    assert decide(ring, x=1)["allowed"] is True
    assert decide(ring, x=2)["reason"] == "other"


def test_ms_context_map_fields_win_over_metadata() -> None:
    (policy,) = parse_policies(
        "rules:\n  - {name: r, condition: {field: user_id, operator: eq, value: mallory}, action: deny}\n",
        source="yaml:x",
    )
    assert isinstance(policy.evaluate(pre(metadata={"user_id": "mallory"})), Deny)  # shows through when unset
    assert policy.evaluate(pre(user_id="alice", metadata={"user_id": "mallory"})) == Admit()
    (response_rule,) = parse_policies(
        "rules:\n  - {name: r, condition: {field: response, operator: contains, value: leak}, action: deny}\n",
        source="yaml:x",
    )
    post = PolicyContext(phase=Phase.POST_RESPONSE, response="a leak")
    assert isinstance(response_rule.evaluate(post), Deny)


# -- /check ----------------------------------------------------------------------------------


def test_check_records_transform_and_prefer_but_goes_on() -> None:
    upper, prefer = Upper(), Fixed("p", Prefer("b", "because"))
    tail = Fixed("tail", Admit())
    answer = check_request(PolicyRing([upper, prefer, tail]), {"agent_id": "a", "context": {"message": "hi"}})
    assert (answer["allowed"], answer["decision"], answer["reason"], answer["matched_policy"]) == (
        True,
        "prefer",
        "",
        "p",
    )
    assert tail.seen == ["hi"]  # not fed forward in /check
    transformed = check_request(PolicyRing([prefer, upper]), {"context": {"message": "hi"}})
    assert (transformed["decision"], transformed["matched_policy"]) == ("transform", "upper")


def test_check_stops_at_the_first_deny_and_a_raise_denies() -> None:
    tail = Fixed("tail", Admit())
    answer = check_request(PolicyRing([Fixed("p", Prefer("b", "r")), Broken(), tail]), {"context": {}})
    assert answer["allowed"] is False
    assert answer["decision"] == "deny"
    assert answer["reason"] == "policy evaluation failed: database unavailable"
    assert answer["matched_policy"] == "broken"
    assert answer["matched_source"] == "code:test"
    assert tail.seen == []


def test_check_maps_the_body_onto_the_context() -> None:
    seen: list[PolicyContext] = []

    class Spy(BasePolicy):
        def evaluate(self, context: PolicyContext) -> Decision:
            seen.append(context)
            return Admit()

    spy = Spy(PolicyIdentity.of("spy", "code:test", "1", ""))
    check_request(PolicyRing([spy]), {"agent_id": "a1", "action": "call_tool", "context": {"message": "m", "k": 2}})
    check_request(PolicyRing([spy]), {"action": "outer", "context": {"action": "inner"}})
    assert seen[0].phase is Phase.PRE_ADMISSION
    assert (seen[0].agent_id, seen[0].message) == ("a1", "m")
    assert seen[0].metadata == {"message": "m", "k": 2, "action": "call_tool"}
    assert seen[1].metadata["action"] == "inner"


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ([], "must be a JSON object"),
        ({"context": "x"}, "'context' must be an object"),
        ({"agent_id": 3}, "'agent_id' must be a string"),
        ({"action": ["a"]}, "'action' must be a string"),
    ],
)
def test_check_refuses_a_bad_body(body: Any, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        check_request(PolicyRing([]), body)


# -- registered policies ---------------------------------------------------------------------


@pytest.fixture
def clean_registry() -> Iterator[None]:
    clear_registered_policies()
    yield
    clear_registered_policies()


@pytest.mark.usefixtures("clean_registry")
def test_register_policy_keeps_order_and_identity() -> None:
    class NoFridayDeploys(BasePolicy):
        def __init__(self) -> None:
            super().__init__(PolicyIdentity.for_code("no-friday-deploys", type(self)))

        def evaluate(self, context: PolicyContext) -> Decision:
            return Deny("not on a Friday") if "deploy" in context.message else Admit()

    policy = NoFridayDeploys()
    other = Fixed("other", Admit())
    register_policy(policy)
    register_policy(other)
    register_policy(policy)  # once per object
    assert registered_policies() == [policy, other]
    assert policy.identity.source.startswith("code:")
    assert policy.identity.source.endswith("NoFridayDeploys")
    ring = PolicyRing(registered_policies())
    assert ring.evaluate(pre("deploy now")).decision == Deny("not on a Friday")


@pytest.mark.usefixtures("clean_registry")
def test_register_policy_refuses_a_non_policy() -> None:
    with pytest.raises(TypeError, match="is not a policy"):
        register_policy(object())  # type: ignore[arg-type]


def test_policy_protocol_is_structural() -> None:
    class Duck:
        identity = PolicyIdentity.of("duck", "code:duck", "1", "")

        def evaluate(self, context: PolicyContext) -> Decision:
            return Admit()

        def release(self, context: PolicyContext) -> None:
            return None

    duck: Policy = Duck()
    assert isinstance(duck, Policy)
    assert PolicyRing([duck]).evaluate(pre()).allowed
