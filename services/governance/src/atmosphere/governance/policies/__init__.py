"""Governance policies as code: the SPI, the 14 built-in types, both YAML schemas, the ring, `/check`.

Pure: no bus and no I/O except `load_policy_files` reading its files. The governance service wires
it (`PolicyRing` over `load_policy_files(...) + registered_policies()`).
"""

from atmosphere.governance.policies.admission import (
    AuthorizationPolicy,
    KillSwitch,
    MetadataPresencePolicy,
)
from atmosphere.governance.policies.check import check_request
from atmosphere.governance.policies.content import (
    AllowListPolicy,
    DenyListPolicy,
    MessageLengthPolicy,
    PreferencePolicy,
)
from atmosphere.governance.policies.dryrun import DryRunPolicy, ShadowCounts
from atmosphere.governance.policies.guardrails import (
    CostCeilingPolicy,
    OutputLengthZScorePolicy,
    PiiMode,
    PiiRedactionPolicy,
)
from atmosphere.governance.policies.limits import ConcurrencyLimitPolicy, RateLimitPolicy, TimeWindowPolicy
from atmosphere.governance.policies.loader import load_policy_files, parse_policies
from atmosphere.governance.policies.matching import PatternSet
from atmosphere.governance.policies.model import (
    Admit,
    BasePolicy,
    Decision,
    Deny,
    Phase,
    Policy,
    PolicyContext,
    PolicyFileError,
    PolicyIdentity,
    Prefer,
    Transform,
)
from atmosphere.governance.policies.moderation import (
    LlmModerationPolicy,
    ModerationPolicy,
    RuleBasedModerationPolicy,
)
from atmosphere.governance.policies.moderation_rules import Category as ModerationCategory
from atmosphere.governance.policies.ms import MsAgentOsPolicy
from atmosphere.governance.policies.native import NATIVE_TYPES
from atmosphere.governance.policies.registry import (
    clear_registered_policies,
    register_policy,
    registered_policies,
)
from atmosphere.governance.policies.ring import Evaluation, PolicyRing

__all__ = [
    "NATIVE_TYPES",
    "Admit",
    "AllowListPolicy",
    "AuthorizationPolicy",
    "BasePolicy",
    "ConcurrencyLimitPolicy",
    "CostCeilingPolicy",
    "Decision",
    "Deny",
    "DenyListPolicy",
    "DryRunPolicy",
    "Evaluation",
    "KillSwitch",
    "LlmModerationPolicy",
    "MessageLengthPolicy",
    "MetadataPresencePolicy",
    "ModerationCategory",
    "ModerationPolicy",
    "MsAgentOsPolicy",
    "OutputLengthZScorePolicy",
    "PatternSet",
    "Phase",
    "PiiMode",
    "PiiRedactionPolicy",
    "Policy",
    "PolicyContext",
    "PolicyFileError",
    "PolicyIdentity",
    "PolicyRing",
    "Prefer",
    "PreferencePolicy",
    "RateLimitPolicy",
    "RuleBasedModerationPolicy",
    "ShadowCounts",
    "TimeWindowPolicy",
    "Transform",
    "check_request",
    "clear_registered_policies",
    "load_policy_files",
    "parse_policies",
    "register_policy",
    "registered_policies",
]
