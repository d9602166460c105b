"""Deterministic classifiers and encoders for the screen tests."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence

from atmosphere.governance.injection import Classification, Verdict
from atmosphere.governance.screens import Tier


class FixedClassifier:
    """Always answers `result`, and records what it was asked."""

    def __init__(self, result: Classification, tier: Tier = Tier.EMBEDDING_SIMILARITY) -> None:
        self.result = result
        self._tier = tier
        self.seen: list[str] = []

    @property
    def tier(self) -> Tier:
        return self._tier

    async def classify(self, text: str) -> Classification:
        self.seen.append(text)
        return self.result


class RaisingClassifier:
    """A classifier that breaks the protocol by raising."""

    @property
    def tier(self) -> Tier:
        return Tier.LLM_CLASSIFIER

    async def classify(self, text: str) -> Classification:
        raise RuntimeError("model crashed")


ERROR = Classification(Verdict.ERROR, 0.0, None, "classifier down")
INJECTED = Classification(Verdict.INJECTED, 0.9, "exemplar:x", "looks like an attack")
SAFE = Classification(Verdict.SAFE, 1.0, None, "")


class BagOfWordsEncoder:
    """Hashes lower-cased words into a fixed number of buckets: similar wording, similar vectors."""

    def __init__(self, dimension: int = 256) -> None:
        self.dimension = dimension
        self.calls: list[list[str]] = []

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        vectors = []
        for text in texts:
            vector = [0.0] * self.dimension
            for word in re.findall(r"[a-z]+", text.lower()):
                vector[int(hashlib.sha256(word.encode()).hexdigest(), 16) % self.dimension] += 1.0
            norm = math.sqrt(sum(x * x for x in vector)) or 1.0
            vectors.append([x / norm for x in vector])
        return vectors


class BrokenEncoder:
    """Raises, or returns the wrong number of vectors."""

    def __init__(self, *, short: bool = False) -> None:
        self.short = short

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        if self.short:
            return [[1.0, 0.0]]
        raise OSError("onnx session lost")
