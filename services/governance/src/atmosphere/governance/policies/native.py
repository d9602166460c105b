"""The 14 built-in `type:`s of the native schema, each building its policy from a `config:` block.

Config keys are dash-case with the original's defaults. Unknown keys are refused (a typo such as
`max_chars` would otherwise silently install a policy with the default).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final
from zoneinfo import available_timezones

from atmosphere.governance.policies.admission import AuthorizationPolicy, KillSwitch, MetadataPresencePolicy
from atmosphere.governance.policies.content import (
    AllowListPolicy,
    DenyListPolicy,
    MessageLengthPolicy,
    PreferencePolicy,
)
from atmosphere.governance.policies.guardrails import (
    CostCeilingPolicy,
    OutputLengthZScorePolicy,
    PiiMode,
    PiiRedactionPolicy,
)
from atmosphere.governance.policies.limits import (
    WEEKDAYS,
    ConcurrencyLimitPolicy,
    RateLimitPolicy,
    TimeWindowPolicy,
    parse_clock_time,
    parse_days,
)
from atmosphere.governance.policies.matching import PatternSet
from atmosphere.governance.policies.model import Policy, PolicyIdentity
from atmosphere.governance.policies.moderation import MODERATION_KEYS, build_moderation
from atmosphere.governance.policies.yamldoc import Config


@dataclass(frozen=True)
class NativeType:
    """A built-in type: the config keys it reads and how it builds its policy."""

    keys: frozenset[str]
    build: Callable[[PolicyIdentity, Config], Policy]


def _patterns(config: Config) -> PatternSet:
    return PatternSet.build(config.strings("phrases"), config.strings("regex"))


def _pii(identity: PolicyIdentity, config: Config) -> Policy:
    mode = config.text("mode", "redact").strip().lower()
    if mode not in set(PiiMode):
        raise config.fail("mode", f"unknown pii-redaction mode '{mode}' (supported: redact, block)")
    return PiiRedactionPolicy(identity, PiiMode(mode))


def _cost(identity: PolicyIdentity, config: Config) -> Policy:
    return CostCeilingPolicy(identity, config.number("budget-usd", 0.0))


def _zscore(identity: PolicyIdentity, config: Config) -> Policy:
    return OutputLengthZScorePolicy(
        identity,
        config.integer("window-size", 50),
        config.number("z-threshold", 3.0),
        config.integer("min-samples", 10),
    )


def _preference(identity: PolicyIdentity, config: Config) -> Policy:
    return PreferencePolicy(identity, _patterns(config), config.text("prefer", ""), config.text("reason", ""))


def _time_window(identity: PolicyIdentity, config: Config) -> Policy:
    zone = config.text("zone", "UTC").strip()
    if zone not in _zones():
        raise config.fail("zone", f"unknown time zone '{zone}'")
    days = parse_days(config.strings("days")) if config.node("days") is not None else WEEKDAYS
    start = parse_clock_time(config.text("start", "09:00"))
    end = parse_clock_time(config.text("end", "17:00"))
    return TimeWindowPolicy(identity, start, end, zone, days)


@functools.cache
def _zones() -> frozenset[str]:
    # Checked against the zone database's names first: `ZoneInfo` would also try to open a
    # file named after an arbitrary key.
    return frozenset(available_timezones()) | {"UTC"}


def _kill_switch(identity: PolicyIdentity, config: Config) -> Policy:
    return KillSwitch(identity)


_PATTERN_KEYS: Final = frozenset({"phrases", "regex"})

NATIVE_TYPES: Final[dict[str, NativeType]] = {
    "pii-redaction": NativeType(frozenset({"mode"}), _pii),
    "cost-ceiling": NativeType(frozenset({"budget-usd"}), _cost),
    "output-length-zscore": NativeType(frozenset({"window-size", "z-threshold", "min-samples"}), _zscore),
    "deny-list": NativeType(_PATTERN_KEYS, lambda i, c: DenyListPolicy(i, _patterns(c))),
    "allow-list": NativeType(_PATTERN_KEYS, lambda i, c: AllowListPolicy(i, _patterns(c))),
    "preference": NativeType(_PATTERN_KEYS | {"prefer", "reason"}, _preference),
    "message-length": NativeType(
        frozenset({"max-chars"}), lambda i, c: MessageLengthPolicy(i, c.integer("max-chars", 0))
    ),
    "rate-limit": NativeType(
        frozenset({"limit", "window-seconds"}),
        lambda i, c: RateLimitPolicy(i, c.integer("limit", 0), c.integer("window-seconds", 0)),
    ),
    "concurrency-limit": NativeType(
        frozenset({"max-concurrent"}), lambda i, c: ConcurrencyLimitPolicy(i, c.integer("max-concurrent", 0))
    ),
    "time-window": NativeType(frozenset({"start", "end", "zone", "days"}), _time_window),
    "kill-switch": NativeType(frozenset(), _kill_switch),
    "metadata-presence": NativeType(
        frozenset({"required-keys"}), lambda i, c: MetadataPresencePolicy(i, c.strings("required-keys"))
    ),
    "authorization": NativeType(
        frozenset({"required-roles"}), lambda i, c: AuthorizationPolicy(i, c.strings("required-roles"))
    ),
    "moderation": NativeType(MODERATION_KEYS, build_moderation),
}
"""Every built-in `type:` by name."""
