"""Every built-in type, built from YAML as an operator writes it: its admit and its deny (exact texts)."""

from __future__ import annotations

from datetime import UTC, datetime
from datetime import time as clock_time

import pytest

from atmosphere.governance.policies import (
    Admit,
    ConcurrencyLimitPolicy,
    CostCeilingPolicy,
    Deny,
    KillSwitch,
    OutputLengthZScorePolicy,
    Phase,
    PiiRedactionPolicy,
    Policy,
    PolicyContext,
    PolicyIdentity,
    Prefer,
    RateLimitPolicy,
    TimeWindowPolicy,
    Transform,
    parse_policies,
)

PRE = Phase.PRE_ADMISSION
POST = Phase.POST_RESPONSE
ID = PolicyIdentity.of("t", "code:test", "1", "")


def one(yaml_text: str) -> Policy:
    policies = parse_policies(yaml_text, source="yaml:test.yaml")
    assert len(policies) == 1
    return policies[0]


def native(kind: str, config: str = "") -> Policy:
    block = f"\n    config:\n{config}" if config else ""
    return one(f"policies:\n  - name: p\n    type: {kind}{block}\n")


def ctx(message: str = "", phase: Phase = PRE, **kwargs: object) -> PolicyContext:
    return PolicyContext(phase=phase, message=message, **kwargs)  # type: ignore[arg-type]


# -- pii-redaction ---------------------------------------------------------------------------


def test_pii_redact_rewrites_the_message() -> None:
    policy = native("pii-redaction")
    decision = policy.evaluate(ctx("mail me at jo@example.com"))
    assert isinstance(decision, Transform)
    assert decision.context.message == "mail me at [redacted-email]"
    assert policy.evaluate(ctx("nothing personal")) == Admit()


def test_pii_block_refuses_the_request_with_the_kinds() -> None:
    policy = native("pii-redaction", "      mode: block\n")
    assert policy.evaluate(ctx("jo@example.com, 123-45-6789")) == Deny("request contains PII of kinds: [email, us-ssn]")
    assert policy.evaluate(ctx("hello")) == Admit()


@pytest.mark.parametrize("mode", ["redact", "block"])
def test_pii_in_a_response_is_refused_in_both_modes(mode: str) -> None:
    policy = native("pii-redaction", f"      mode: {mode}\n")
    assert policy.evaluate(ctx(phase=POST, response="write to jo@example.com")) == Deny(
        "response contains PII of kinds: [email]"
    )
    assert policy.evaluate(ctx(phase=POST, response="fine")) == Admit()


def test_pii_from_code_is_named_after_its_class() -> None:
    identity = PiiRedactionPolicy().identity
    assert identity.name == "PiiRedactionPolicy"
    assert identity.source == "code:atmosphere.governance.policies.guardrails.PiiRedactionPolicy"
    assert identity.version == "embedded"


# -- cost-ceiling ----------------------------------------------------------------------------


def test_cost_ceiling_refuses_a_tenant_once_its_budget_is_spent() -> None:
    policy = native("cost-ceiling", "      budget-usd: 1.5\n")
    assert isinstance(policy, CostCeilingPolicy)
    acme = ctx("hi", metadata={"tenant": "acme"})
    assert policy.evaluate(acme) == Admit()
    policy.add_cost("acme", 1.0)
    assert policy.evaluate(acme) == Admit()
    policy.add_cost("acme", 0.5)
    assert policy.evaluate(acme) == Deny("cost ceiling reached for tenant acme (spent 1.5000 of budget 1.5)")
    # Another tenant, and the default bucket, are untouched.
    assert policy.evaluate(ctx("hi", metadata={"tenant": "globex"})) == Admit()
    assert policy.evaluate(ctx("hi")) == Admit()


def test_cost_ceiling_without_a_tenant_uses_the_default_bucket() -> None:
    policy = CostCeilingPolicy(ID, 2.0)
    policy.add_cost("", 3.0)
    assert policy.evaluate(ctx("x")) == Deny("cost ceiling reached for tenant __default__ (spent 3.0000 of budget 2.0)")


def test_cost_ceiling_zero_budget_is_off_and_spend_rolls_over() -> None:
    now = [0.0]
    assert CostCeilingPolicy(ID, 0.0).evaluate(ctx("x")) == Admit()
    policy = CostCeilingPolicy(ID, 1.0, window_seconds=100.0, clock=lambda: now[0])
    policy.add_cost("t", 5.0)
    assert isinstance(policy.evaluate(ctx("x", metadata={"tenant": "t"})), Deny)
    now[0] = 101.0
    assert policy.evaluate(ctx("x", metadata={"tenant": "t"})) == Admit()
    assert policy.spent("t") == 0.0


def test_cost_ceiling_tracks_at_most_the_cap_of_tenants() -> None:
    policy = CostCeilingPolicy(ID, 1.0, max_tenants=2)
    for tenant in ("a", "b", "c", "d"):
        policy.add_cost(tenant, 0.4)
    assert policy.tracked_tenants == 3  # a, b, and the shared default bucket
    assert policy.spent("__default__") == pytest.approx(0.8)


# -- output-length-zscore --------------------------------------------------------------------


def test_zscore_builds_a_baseline_then_refuses_an_outlier() -> None:
    policy = native("output-length-zscore", "      window-size: 50\n      z-threshold: 3.0\n      min-samples: 10\n")
    for length in (100, 102, 98, 101, 99, 100, 103, 97, 100, 100):
        assert policy.evaluate(ctx(phase=POST, response="x" * length)) == Admit()
    assert policy.evaluate(ctx(phase=POST, response="x" * 101)) == Admit()
    decision = policy.evaluate(ctx(phase=POST, response="x" * 1000))
    assert isinstance(decision, Deny)
    assert decision.reason.startswith("response length z-score ")
    assert decision.reason.endswith(" exceeds threshold 3.0 (tenant=__default__, possible drift)")


def test_zscore_judges_whole_answers_only() -> None:
    policy = OutputLengthZScorePolicy(ID, window_size=5, z_threshold=1.0, min_samples=2)
    for length in (10, 10, 10):
        assert policy.evaluate(PolicyContext(phase=POST, response="x" * length)) == Admit()
    partial = PolicyContext(phase=POST, response="x" * 500, metadata={"partial": True})
    assert policy.evaluate(partial) == Admit()  # a streamed prefix is neither judged nor sampled
    assert isinstance(policy.evaluate(PolicyContext(phase=POST, response="x" * 500)), Deny)


def test_zscore_is_exact_and_per_tenant() -> None:
    policy = OutputLengthZScorePolicy(ID, window_size=5, z_threshold=1.0, min_samples=2)
    for length in (10, 10):
        policy.evaluate(ctx(phase=POST, response="x" * length, metadata={"tenant": "a"}))
    # Variance 0 -> std 1.0; |13 - 10| / 1 = 3.00.
    assert policy.evaluate(ctx(phase=POST, response="x" * 13, metadata={"tenant": "a"})) == Deny(
        "response length z-score 3.00 exceeds threshold 1.0 (tenant=a, possible drift)"
    )
    # Tenant b has no baseline yet.
    assert policy.evaluate(ctx(phase=POST, response="x" * 13, metadata={"tenant": "b"})) == Admit()
    assert policy.evaluate(ctx("anything")) == Admit()


@pytest.mark.parametrize(
    ("config", "problem"),
    [("window-size: 1", "window-size"), ("z-threshold: 0", "z-threshold"), ("min-samples: 1", "min-samples")],
)
def test_zscore_validates_its_config(config: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        native("output-length-zscore", f"      {config}\n")


# -- deny-list / allow-list / preference ------------------------------------------------------


def test_deny_list_screens_message_tool_arguments_and_response() -> None:
    policy = native("deny-list", "      phrases: [drop table]\n      regex: ['rm\\s+-rf']\n")
    assert policy.evaluate(ctx("please DROP TABLE users")) == Deny("deny-list: request matched a denied phrase")
    call = PolicyContext.for_tool_call(tool="shell", arguments={"cmd": {"argv": ["rm  -rf /"]}})
    assert policy.evaluate(call) == Deny("deny-list: tool argument matched a denied phrase")
    assert policy.evaluate(ctx(phase=POST, response="then drop table")) == Deny(
        "deny-list: response matched a denied phrase"
    )
    assert policy.evaluate(ctx("select 1")) == Admit()
    assert policy.evaluate(PolicyContext.for_tool_call(tool="shell", arguments={"cmd": "ls"})) == Admit()


def test_deny_list_matches_tool_names_through_the_synthetic_message() -> None:
    policy = native("deny-list", "      regex: ['^call_tool:delete_']\n")
    assert policy.evaluate(PolicyContext.for_tool_call(tool="delete_file", arguments={})) == Deny(
        "deny-list: request matched a denied phrase"
    )
    assert policy.evaluate(PolicyContext.for_tool_call(tool="read_file", arguments={})) == Admit()


def test_deny_list_falls_back_to_the_arguments_preview() -> None:
    policy = native("deny-list", "      phrases: [secret]\n")
    assert policy.evaluate(ctx("x", metadata={"tool_args_preview": "{'a': 'SECRET'}"})) == Deny(
        "deny-list: tool argument matched a denied phrase"
    )


def test_allow_list_admits_only_matching_messages() -> None:
    policy = native("allow-list", "      phrases: [billing, invoice]\n")
    assert policy.evaluate(ctx("my Invoice is wrong")) == Admit()
    assert policy.evaluate(ctx("tell me a joke")) == Deny("allow-list: message matched no configured phrase")
    assert policy.evaluate(ctx("   ")) == Deny("allow-list: message matched no configured phrase")
    assert policy.evaluate(ctx(phase=POST, response="anything")) == Admit()


def test_preference_advises_on_a_match() -> None:
    policy = native("preference", "      phrases: [gpt-3]\n      prefer: gpt-4o\n      reason: gpt-3 is retired\n")
    assert policy.evaluate(ctx("use gpt-3 please")) == Prefer("gpt-4o", "gpt-3 is retired")
    assert policy.evaluate(ctx("hello")) == Admit()


@pytest.mark.parametrize(
    ("kind", "config", "problem"),
    [
        ("deny-list", "", "requires 'phrases' or 'regex'"),
        ("allow-list", "      phrases: []\n", "requires 'phrases' or 'regex'"),
        ("preference", "      phrases: [a]\n      reason: r\n", "non-blank 'prefer'"),
        ("preference", "      phrases: [a]\n      prefer: b\n", "non-blank 'reason'"),
        ("deny-list", "      regex: ['(unclosed']\n", "invalid regex"),
        ("deny-list", f"      regex: ['{'a' * 1001}']\n", "longer than 1000"),
    ],
)
def test_pattern_policies_validate_their_config(kind: str, config: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        native(kind, config)


# -- message-length --------------------------------------------------------------------------


def test_message_length() -> None:
    policy = native("message-length", "      max-chars: 5\n")
    assert policy.evaluate(ctx("12345")) == Admit()
    assert policy.evaluate(ctx("123456")) == Deny("message length 6 exceeds maximum 5 characters")
    with pytest.raises(ValueError, match="positive 'max-chars'"):
        native("message-length", "      max-chars: 0\n")


# -- rate-limit ------------------------------------------------------------------------------


def test_rate_limit_is_a_sliding_window_per_subject() -> None:
    now = [1000.0]
    policy = RateLimitPolicy(ID, 2, 60, clock=lambda: now[0])
    alice = ctx("x", user_id="alice")
    assert policy.evaluate(alice) == Admit()
    now[0] += 30
    assert policy.evaluate(alice) == Admit()
    assert policy.evaluate(alice) == Deny("rate-limited: user:alice exceeded 2 requests per 60s")
    assert policy.evaluate(ctx("x", session_id="s1")) == Admit()  # another subject
    now[0] += 31  # the first hit left the window
    assert policy.evaluate(alice) == Admit()
    assert policy.evaluate(alice) == Deny("rate-limited: user:alice exceeded 2 requests per 60s")


def test_rate_limit_subjects() -> None:
    policy = RateLimitPolicy(ID, 1, 10, clock=lambda: 0.0)
    policy.evaluate(ctx("x", session_id="s"))
    assert policy.evaluate(ctx("x", session_id="s")) == Deny("rate-limited: session:s exceeded 1 requests per 10s")
    policy.evaluate(ctx("x"))
    assert policy.evaluate(ctx("x")) == Deny("rate-limited: anonymous exceeded 1 requests per 10s")
    assert policy.evaluate(ctx(phase=POST)) == Admit()


def test_rate_limit_from_yaml_validates() -> None:
    assert isinstance(native("rate-limit", "      limit: 3\n      window-seconds: 60\n"), RateLimitPolicy)
    with pytest.raises(ValueError, match="positive 'limit'"):
        native("rate-limit", "      window-seconds: 60\n")
    with pytest.raises(ValueError, match="positive 'window-seconds'"):
        native("rate-limit", "      limit: 3\n")


# -- concurrency-limit -----------------------------------------------------------------------


def test_concurrency_limit_takes_and_gives_back_slots() -> None:
    policy = native("concurrency-limit", "      max-concurrent: 1\n")
    assert isinstance(policy, ConcurrencyLimitPolicy)
    bob = ctx("x", user_id="bob")
    assert policy.evaluate(bob) == Admit()
    assert policy.evaluate(bob) == Deny("concurrency limit: user:bob already has 1 in-flight (max 1)")
    # An answer's check does not free it (answers are checked several times while they stream) ...
    assert policy.evaluate(PolicyContext(phase=POST, user_id="bob", response="done")) == Admit()
    assert policy.in_flight("user:bob") == 1
    policy.release(bob)  # ... the run's end does
    assert policy.evaluate(bob) == Admit()
    policy.release(bob)
    policy.release(bob)  # never below zero
    assert policy.in_flight("user:bob") == 0
    assert policy.evaluate(bob) == Admit()


# -- time-window -----------------------------------------------------------------------------


def _window(at: datetime, **kwargs: object) -> TimeWindowPolicy:
    return TimeWindowPolicy(ID, clock_time(9), clock_time(17), now=lambda: at, **kwargs)  # type: ignore[arg-type]


def test_time_window_inside_and_outside() -> None:
    wednesday_noon = datetime(2026, 1, 7, 12, 0, tzinfo=UTC)
    saturday_noon = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
    wednesday_night = datetime(2026, 1, 7, 17, 0, tzinfo=UTC)  # end is exclusive
    assert _window(wednesday_noon).evaluate(ctx("x")) == Admit()
    expected = Deny("outside allowed window 09:00-17:00 (UTC) on [MONDAY, TUESDAY, WEDNESDAY, THURSDAY, FRIDAY]")
    assert _window(saturday_noon).evaluate(ctx("x")) == expected
    assert _window(wednesday_night).evaluate(ctx("x")) == expected
    assert _window(saturday_noon).evaluate(ctx(phase=POST)) == Admit()


def test_time_window_zone_and_wrap_around() -> None:
    # 23:30 UTC on a Tuesday is 18:30 in New York: outside 9-17 there.
    at = datetime(2026, 1, 6, 23, 30, tzinfo=UTC)
    assert isinstance(_window(at, zone="America/New_York").evaluate(ctx("x")), Deny)
    night = TimeWindowPolicy(ID, clock_time(22), clock_time(6), days=frozenset(range(7)), now=lambda: at)
    assert night.evaluate(ctx("x")) == Admit()


def test_time_window_from_yaml() -> None:
    policy = native(
        "time-window", "      start: '22:00'\n      end: '06:00'\n      zone: Europe/Paris\n      days: [saturday]\n"
    )
    assert isinstance(policy, TimeWindowPolicy)
    assert policy.days == frozenset({5})
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Base'"):
        native("time-window", "      zone: Mars/Base\n")
    with pytest.raises(ValueError, match="unknown day-of-week: someday"):
        native("time-window", "      days: [someday]\n")
    with pytest.raises(ValueError, match="expected a time of day"):
        native("time-window", "      start: noon\n")


# -- kill-switch -----------------------------------------------------------------------------


def state_of(switch: KillSwitch) -> tuple[bool, str | None, datetime | None]:
    return switch.armed, switch.armed_reason, switch.armed_at


def test_kill_switch_denies_while_armed() -> None:
    policy = native("kill-switch")
    assert isinstance(policy, KillSwitch)
    assert policy.evaluate(ctx("x")) == Admit()
    policy.arm("incident 42: model leaking data", "oncall@example.com")
    assert policy.armed
    assert policy.armed_reason == "incident 42: model leaking data"
    assert policy.armed_at is not None
    assert policy.evaluate(ctx("x")) == Deny("incident 42: model leaking data")
    assert policy.evaluate(ctx(phase=POST, response="y")) == Deny("incident 42: model leaking data")
    policy.disarm()
    # Read through a call: mypy would keep the properties narrowed from before `disarm`.
    assert state_of(policy) == (False, None, None)
    assert policy.evaluate(ctx("x")) == Admit()


def test_kill_switch_from_code() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    switch = KillSwitch(now=lambda: at)
    assert switch.identity.name == "kill-switch"
    assert switch.identity.source == "code:atmosphere.governance.policies.admission.KillSwitch"
    switch.arm("stop")
    assert switch.armed_at == at
    with pytest.raises(ValueError, match="blank"):
        switch.arm("  ")


# -- metadata-presence / authorization ------------------------------------------------------


def test_metadata_presence() -> None:
    policy = native("metadata-presence", "      required-keys: [tenant, purpose]\n")
    assert policy.evaluate(ctx("x", metadata={"tenant": "a", "purpose": "b"})) == Admit()
    assert policy.evaluate(ctx("x", metadata={"tenant": "a", "purpose": " "})) == Deny(
        "required metadata key 'purpose' is missing"
    )
    assert policy.evaluate(ctx("x")) == Deny("required metadata key 'tenant' is missing")
    with pytest.raises(ValueError, match="at least one entry under 'required-keys'"):
        native("metadata-presence", "      required-keys: []\n")


def test_authorization() -> None:
    policy = native("authorization", "      required-roles: [admin, billing]\n")
    assert policy.evaluate(ctx("x", metadata={"roles": ["admin", "billing"]})) == Admit()
    assert policy.evaluate(ctx("x", metadata={"roles": "admin, billing"})) == Admit()
    assert policy.evaluate(ctx("x")) == Deny("no roles claimed by subject; required: [admin, billing]")
    assert policy.evaluate(ctx("x", metadata={"roles": "admin,ops"})) == Deny(
        "missing required role 'billing' (subject holds: [admin, ops])"
    )
    call = PolicyContext.for_tool_call(tool="t", arguments={}, roles=["admin", "billing"])
    assert policy.evaluate(call) == Admit()
    assert policy.evaluate(ctx(phase=POST)) == Admit()
    with pytest.raises(ValueError, match="at least one entry under 'required-roles'"):
        native("authorization", "")


def test_tool_call_context_shape() -> None:
    args = {"path": "x" * 300}
    call = PolicyContext.for_tool_call(tool="write_file", arguments=args, user_id="u", conversation_id="c")
    assert call.message == "call_tool:write_file"
    assert call.system_prompt == ""
    assert call.metadata["tool_name"] == "write_file"
    assert call.metadata["action"] == "call_tool"
    assert call.metadata["tool_args"] == args
    preview = call.metadata["tool_args_preview"]
    assert len(preview) == 201
    assert preview.endswith("…")
    assert "roles" not in call.metadata
