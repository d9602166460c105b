"""The content policies: deny-list, allow-list, preference and message-length.

Deny texts are the original's verbatim. A deny-list never echoes the rule that matched: that
would leak the list to whoever is probing it.
"""

from __future__ import annotations

from atmosphere.governance.policies.matching import PatternSet, strings_in
from atmosphere.governance.policies.model import (
    ADMIT,
    BasePolicy,
    Decision,
    Deny,
    Phase,
    PolicyContext,
    PolicyIdentity,
    Prefer,
)


class DenyListPolicy(BasePolicy):
    """Deny when a denied phrase or regex occurs in the message, the tool arguments or the answer."""

    def __init__(self, identity: PolicyIdentity, patterns: PatternSet) -> None:
        super().__init__(identity)
        self.patterns = patterns

    def evaluate(self, context: PolicyContext) -> Decision:
        if context.phase is Phase.POST_RESPONSE:
            return self._deny_if(self.patterns.search(context.response), "response")
        if self.patterns.search(context.message):
            return self._deny_if(True, "request")
        return self._deny_if(self._tool_arguments_match(context), "tool argument")

    def _tool_arguments_match(self, context: PolicyContext) -> bool:
        # The full arguments when the caller passed them, else the preview (the original's order).
        arguments = context.metadata.get("tool_args")
        if arguments is None:
            arguments = context.metadata.get("tool_args_preview")
        return any(self.patterns.search(text) for text in strings_in(arguments))

    @staticmethod
    def _deny_if(matched: bool, origin: str) -> Decision:
        return Deny(f"deny-list: {origin} matched a denied phrase") if matched else ADMIT


class AllowListPolicy(BasePolicy):
    """Admit only a message that matches a configured phrase or regex (pre-admission only)."""

    def __init__(self, identity: PolicyIdentity, patterns: PatternSet) -> None:
        super().__init__(identity)
        self.patterns = patterns

    def evaluate(self, context: PolicyContext) -> Decision:
        if context.phase is Phase.POST_RESPONSE or self.patterns.search(context.message):
            return ADMIT
        return Deny("allow-list: message matched no configured phrase")


class PreferencePolicy(BasePolicy):
    """Advise `preferred` (with `reason`) when the message matches (pre-admission only)."""

    def __init__(self, identity: PolicyIdentity, patterns: PatternSet, preferred: str, reason: str) -> None:
        if not preferred.strip():
            raise ValueError("preference requires a non-blank 'prefer' (the preferred alternative) under config")
        if not reason.strip():
            raise ValueError("preference requires a non-blank 'reason' under config")
        super().__init__(identity)
        self.patterns = patterns
        self.preferred = preferred
        self.reason = reason

    def evaluate(self, context: PolicyContext) -> Decision:
        if context.phase is Phase.PRE_ADMISSION and self.patterns.search(context.message):
            return Prefer(self.preferred, self.reason)
        return ADMIT


class MessageLengthPolicy(BasePolicy):
    """Deny a message longer than `max_chars` characters (pre-admission only)."""

    def __init__(self, identity: PolicyIdentity, max_chars: int) -> None:
        if max_chars <= 0:
            raise ValueError("message-length requires a positive 'max-chars' under config")
        super().__init__(identity)
        self.max_chars = max_chars

    def evaluate(self, context: PolicyContext) -> Decision:
        length = len(context.message)
        if context.phase is Phase.PRE_ADMISSION and length > self.max_chars:
            return Deny(f"message length {length} exceeds maximum {self.max_chars} characters")
        return ADMIT
