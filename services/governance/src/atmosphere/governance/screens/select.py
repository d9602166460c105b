"""Choosing a tier by name: every higher tier is layered on the RULE_BASED floor."""

from __future__ import annotations

from dataclasses import dataclass

from atmosphere.governance.screens.embedding import EmbeddingSimilarityClassifier, Encoder
from atmosphere.governance.screens.layered import LayeredClassifier
from atmosphere.governance.screens.rule_based import RuleBasedClassifier
from atmosphere.governance.screens.tiers import InjectionClassifier, Tier, TierUnavailable


@dataclass(frozen=True, slots=True)
class LlmEndpoint:
    """Where the LLM_CLASSIFIER tier asks: an OpenAI-compatible base URL, a model, an optional key."""

    base_url: str
    model: str
    api_key: str | None = None
    timeout_s: float = 10.0


def build_classifier(
    tier: Tier | str,
    *,
    encoder: Encoder | None = None,
    llm: LlmEndpoint | None = None,
) -> InjectionClassifier:
    """The classifier for `tier` (a `Tier` or its name).

    EMBEDDING_SIMILARITY uses `encoder` (an `embedding.Encoder`) or loads the shipped MiniLM model;
    LLM_CLASSIFIER needs `llm`. Raises `TierUnavailable` (with a reason to report) when the tier
    cannot run, and `ValueError` for an unknown tier name.
    """
    chosen = tier if isinstance(tier, Tier) else Tier.parse(tier)
    floor = RuleBasedClassifier()
    if chosen is Tier.RULE_BASED:
        return floor
    if chosen is Tier.EMBEDDING_SIMILARITY:
        # The loader imports onnxruntime & co. only when called: governance runs without them.
        from atmosphere.governance.screens.minilm import load_minilm_encoder  # noqa: PLC0415 - optional

        return LayeredClassifier([floor, EmbeddingSimilarityClassifier(encoder or load_minilm_encoder())])
    if llm is None:
        raise TierUnavailable(chosen, "no endpoint configured (base URL and model)")
    try:  # httpx is imported only for this tier
        from atmosphere.governance.screens.llm import LlmClassifier  # noqa: PLC0415 - optional
    except ImportError as exc:
        raise TierUnavailable(chosen, f"httpx is not installed: {exc}") from exc
    return LayeredClassifier(
        [floor, LlmClassifier(base_url=llm.base_url, model=llm.model, api_key=llm.api_key, timeout_s=llm.timeout_s)]
    )
