"""Defence in depth: a higher tier runs on top of the RULE_BASED floor, never instead of it."""

from __future__ import annotations

from collections.abc import Sequence

from atmosphere.governance.injection import Classification, Verdict
from atmosphere.governance.screens.tiers import InjectionClassifier, Tier


class LayeredClassifier:
    """Layers run cheapest first; the first INJECTED wins, else the first ERROR, else the last SAFE.

    A higher tier therefore only adds recall: the canonical attacks the probes catch are caught even
    when the embedding model or the LLM is weak or down. The reported tier is the deepest layer's.
    """

    def __init__(self, layers: Sequence[InjectionClassifier]) -> None:
        if not layers:
            raise ValueError("a layered classifier needs at least one layer")
        self._layers = tuple(layers)

    @property
    def tier(self) -> Tier:
        """The deepest (last) layer's tier."""
        return self._layers[-1].tier

    @property
    def layers(self) -> tuple[InjectionClassifier, ...]:
        """The layers, cheapest first."""
        return self._layers

    async def aclose(self) -> None:
        """Close every layer that holds a resource (the LLM tier's HTTP client)."""
        for layer in self._layers:
            close = getattr(layer, "aclose", None)
            if close is not None:
                await close()

    async def classify(self, text: str) -> Classification:
        """Classify with every layer until one finds an injection."""
        first_error: Classification | None = None
        last_safe: Classification | None = None
        for layer in self._layers:
            result = await classify_safely(layer, text)
            if result.verdict is Verdict.INJECTED:
                return result
            if result.verdict is Verdict.ERROR:
                first_error = first_error or result
            else:
                last_safe = result
        if first_error is not None:
            return first_error
        assert last_safe is not None  # at least one layer ran and none was INJECTED or ERROR
        return last_safe


async def classify_safely(classifier: InjectionClassifier, text: str) -> Classification:
    """`classifier.classify(text)`, with an exception turned into an ERROR naming it.

    The protocol says a classifier does not raise; this holds the screens to it even for a
    classifier written elsewhere, so a bug becomes a breach-policy decision, not a crashed tool call.
    """
    try:
        return await classifier.classify(text)
    except Exception as exc:  # any failure of a classifier is an ERROR verdict
        return Classification(Verdict.ERROR, 0.0, None, f"{classifier.tier.value} classifier raised {exc!r}")
