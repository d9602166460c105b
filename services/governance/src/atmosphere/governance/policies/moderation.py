"""The `moderation` policy: refuse requests and answers that seek or give harmful help, by rules or an LLM.

Two tiers, chosen by `tier:` in the config. `rule-based` (the default) runs the curated intent
lexicon of `moderation_rules` in-process, in linear time; `llm` asks an OpenAI-compatible endpoint
(`moderation_llm`) and fails closed: any failure is a deny. The request phase reads the message
and, for a `call_tool:` context, the tool arguments (the full `tool_args`, else the preview, as
deny-list does); the response phase reads the answer so far.

Deny texts never echo what matched (that would teach a prober the lexicon):
`moderation: <request|response> flagged for <category>`, and for the `llm` tier's failures
`moderation: classifier unavailable (fail-closed)`.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import ClassVar, Final, TypeVar

from atmosphere.governance.policies.matching import strings_in
from atmosphere.governance.policies.model import ADMIT, BasePolicy, Decision, Deny, Phase, PolicyContext, PolicyIdentity
from atmosphere.governance.policies.moderation_llm import (
    MAX_TIMEOUT_SECONDS,
    ClassifierUnavailableError,
    ModerationClassifier,
    is_env_name,
)
from atmosphere.governance.policies.moderation_rules import Category, Lexicon
from atmosphere.governance.policies.yamldoc import Config

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

RULE_BASED_TIER: Final = "rule-based"
LLM_TIER: Final = "llm"
UNAVAILABLE_REASON: Final = "moderation: classifier unavailable (fail-closed)"
PHASE_NAMES: Final = {"request": Phase.PRE_ADMISSION, "response": Phase.POST_RESPONSE}
_LLM_KEYS: Final = frozenset({"base-url", "model", "api-key-env", "timeout-seconds"})
MODERATION_KEYS: Final = frozenset({"categories", "phases", "tier"}) | _LLM_KEYS
"""The config keys of `type: moderation`."""
DEFAULT_TIMEOUT_SECONDS: Final = 5.0


def _phase_label(phase: Phase) -> str:
    return "request" if phase is Phase.PRE_ADMISSION else "response"


def _texts_of(context: PolicyContext) -> list[str]:
    """What a check reads: the answer (post-response), else the message and any tool arguments' strings."""
    if context.phase is Phase.POST_RESPONSE:
        return [context.response]
    arguments = context.metadata.get("tool_args")
    if arguments is None:
        arguments = context.metadata.get("tool_args_preview")
    return [context.message, *strings_in(arguments)]


class ModerationPolicy(BasePolicy):
    """Moderation in the configured phases; subclasses say how a text is judged."""

    blocking: ClassVar[bool]
    """Whether `evaluate` waits on I/O (the ring holding it should then run off the event loop)."""

    def __init__(self, identity: PolicyIdentity, categories: Collection[Category], phases: Collection[Phase]) -> None:
        if not categories:
            raise ValueError("moderation needs at least one category")
        if not phases:
            raise ValueError("moderation needs at least one phase")
        super().__init__(identity)
        self.categories = frozenset(categories)
        self.phases = frozenset(phases)

    def evaluate(self, context: PolicyContext) -> Decision:
        if context.phase not in self.phases:
            return ADMIT
        texts = [text for text in _texts_of(context) if text.strip()]
        if not texts:
            return ADMIT
        return self._judge(texts, _phase_label(context.phase))

    def _judge(self, texts: list[str], origin: str) -> Decision:
        raise NotImplementedError

    @staticmethod
    def _flagged(origin: str, category: Category | None) -> Decision:
        return ADMIT if category is None else Deny(f"moderation: {origin} flagged for {category}")


class RuleBasedModerationPolicy(ModerationPolicy):
    """The lexicon tier: in-process, linear in the text, each text scanned up to its first 256 KiB."""

    blocking: ClassVar[bool] = False

    def __init__(self, identity: PolicyIdentity, categories: Collection[Category], phases: Collection[Phase]) -> None:
        super().__init__(identity, categories, phases)
        self.lexicon = Lexicon.of(self.categories)

    def _judge(self, texts: list[str], origin: str) -> Decision:
        return self._flagged(origin, self.lexicon.first_flagged(texts))


class LlmModerationPolicy(ModerationPolicy):
    """The LLM tier: one synchronous call per check; any failure denies (fail-closed)."""

    blocking: ClassVar[bool] = True

    def __init__(
        self,
        identity: PolicyIdentity,
        categories: Collection[Category],
        phases: Collection[Phase],
        classifier: ModerationClassifier,
    ) -> None:
        super().__init__(identity, categories, phases)
        self.classifier = classifier

    def _judge(self, texts: list[str], origin: str) -> Decision:
        # One call for the message and its tool arguments: they are one request.
        try:
            return self._flagged(origin, self.classifier.classify("\n\n".join(texts)))
        except ClassifierUnavailableError as failure:
            _log.warning("moderation policy %r: classifier unavailable: %s", self.identity.name, failure)
            return Deny(UNAVAILABLE_REASON)


def build_moderation(identity: PolicyIdentity, config: Config) -> ModerationPolicy:
    """The `type: moderation` policy of `config`; a `PolicyFileError` on the offending line otherwise."""
    categories = _choices(config, "categories", {c.value: c for c in Category}, "moderation category")
    phases = _choices(config, "phases", PHASE_NAMES, "moderation phase")
    tier = config.text("tier", RULE_BASED_TIER).strip().lower()
    if tier == RULE_BASED_TIER:
        for key in sorted(_LLM_KEYS):
            if key in config.entries:
                raise config.doc.error(config.entries[key][0], f"'{key}' applies only to 'tier: {LLM_TIER}'")
        return RuleBasedModerationPolicy(identity, categories, phases)
    if tier != LLM_TIER:
        raise config.fail("tier", f"unknown moderation tier '{tier}' (supported: {LLM_TIER}, {RULE_BASED_TIER})")
    return LlmModerationPolicy(identity, categories, phases, _classifier(config, categories))


def _classifier(config: Config, categories: frozenset[Category]) -> ModerationClassifier:
    for key in ("base-url", "model"):
        if not config.text(key, "").strip():
            raise config.fail("tier", f"moderation 'tier: {LLM_TIER}' requires a non-blank '{key}'")
    base_url = config.text("base-url", "").strip()
    if not base_url.startswith(("http://", "https://")):
        raise config.fail("base-url", f"'base-url' must be an http:// or https:// URL, got {base_url!r}")
    key_env = config.text("api-key-env", "").strip() or None
    if key_env is not None and not is_env_name(key_env):
        # The value is not repeated: it is likely the key itself, pasted where its variable's name belongs.
        raise config.fail("api-key-env", "'api-key-env' must be the NAME of an environment variable, not the key")
    timeout = config.number("timeout-seconds", DEFAULT_TIMEOUT_SECONDS)
    if not 0 < timeout <= MAX_TIMEOUT_SECONDS:
        raise config.fail("timeout-seconds", f"'timeout-seconds' must be > 0 and <= {MAX_TIMEOUT_SECONDS:g}")
    return ModerationClassifier(
        base_url=base_url,
        model=config.text("model", "").strip(),
        categories=categories,
        api_key_env=key_env,
        timeout_s=timeout,
    )


def _choices(config: Config, key: str, known: Mapping[str, _T], what: str) -> frozenset[_T]:
    """The list under `key` as known values (all of them when absent); an unknown one fails on its line."""
    node = config.node(key)
    if node is None:
        return frozenset(known.values())
    chosen: set[_T] = set()
    for item in config.doc.sequence(node, f"'{key}'"):
        name = config.doc.scalar_text(item, f"an item of '{key}'").strip().lower()
        if name not in known:
            raise config.doc.error(item, f"unknown {what} '{name}' (supported: {', '.join(sorted(known))})")
        chosen.add(known[name])
    if not chosen:
        raise config.fail(key, f"'{key}' must name at least one {what}")
    return frozenset(chosen)
