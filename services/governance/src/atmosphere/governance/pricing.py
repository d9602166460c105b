"""Cost accounting: token usage times a pricing table, the number cost ceilings are fed.

The table ships with governance (`pricing.json`, list prices in USD per million tokens) and a
file named by `ATMOSPHERE_GOVERNANCE__PRICING_FILE` overrides or extends it, model by model.
A model is priced by its exact name, else by the longest listed name it starts with (so a dated
snapshot `gpt-4o-2024-08-06` is priced as `gpt-4o`, never as a shorter unrelated prefix), after
a provider prefix (`openai/…`) is dropped. An unlisted model is unpriced: it costs 0 by the table,
and the answer says so (`priced=False`) rather than guessing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from atmosphere.contracts.common.v1.common_pb2 import Usage

PER_TOKENS = 1_000_000
"""Prices are per million tokens."""


class PricingFileError(ValueError):
    """A pricing file that cannot be used; the message names the file and the entry."""


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens of one model."""

    input: float
    output: float
    cached_input: float

    def cost(self, usage: Usage) -> float:
        """What `usage` costs.

        Cached input tokens are part of the input tokens, at their own rate; a usage that only
        reports a total is priced at the output rate (an upper bound, so a ceiling is never
        reached late).
        """
        inputs, outputs = max(usage.input_tokens, 0), max(usage.output_tokens, 0)
        if inputs == 0 and outputs == 0 and usage.total_tokens > 0:
            return usage.total_tokens * self.output / PER_TOKENS
        cached = min(max(usage.cached_input_tokens, 0), inputs)
        return ((inputs - cached) * self.input + cached * self.cached_input + outputs * self.output) / PER_TOKENS


@dataclass(frozen=True, slots=True)
class Charge:
    """The cost of some usage, and whether every part of it had a price."""

    usd: float
    priced: bool
    unpriced_models: tuple[str, ...] = ()


def _price(source: str, model: str, raw: object) -> Price:
    if not isinstance(raw, Mapping):
        raise PricingFileError(f"{source}: model {model!r} must map to {{input, output, cached_input}}")
    unknown = set(raw) - {"input", "output", "cached_input"}
    if unknown:
        raise PricingFileError(f"{source}: model {model!r} has unknown keys {sorted(unknown)}")
    values: dict[str, float] = {}
    for key in ("input", "output", "cached_input"):
        value = raw.get(key, raw.get("input") if key == "cached_input" else None)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise PricingFileError(f"{source}: model {model!r} needs a price {key!r} >= 0, got {value!r}")
        values[key] = float(value)
    return Price(values["input"], values["output"], values["cached_input"])


def parse_table(text: str, *, source: str) -> dict[str, Price]:
    """The `models` of a pricing document (`{"models": {name: {input, output, cached_input}}}`)."""
    try:
        document: Any = json.loads(text)
    except ValueError as exc:
        raise PricingFileError(f"{source}: not JSON: {exc}") from None
    models = document.get("models") if isinstance(document, dict) else None
    if not isinstance(models, dict):
        raise PricingFileError(f"{source}: expected an object with a 'models' object")
    return {str(name).strip().lower(): _price(source, str(name), raw) for name, raw in models.items()}


class PricingTable:
    """Prices by model name, with the lookup rule above."""

    def __init__(self, prices: Mapping[str, Price]) -> None:
        self._prices = dict(prices)
        # Longest first: the first prefix that matches is the most specific one.
        self._prefixes = sorted(self._prices, key=len, reverse=True)

    @classmethod
    def load(cls, override: Path | None = None) -> PricingTable:
        """The shipped table, with `override`'s models replacing or adding entries."""
        shipped = resources.files("atmosphere.governance").joinpath("pricing.json").read_text(encoding="utf-8")
        prices = parse_table(shipped, source="pricing.json")
        if override is not None:
            try:
                text = override.read_text(encoding="utf-8")
            except OSError as exc:
                raise PricingFileError(f"{override}: cannot read pricing file: {exc}") from None
            prices.update(parse_table(text, source=str(override)))
        return cls(prices)

    def __len__(self) -> int:
        return len(self._prices)

    def listed(self) -> dict[str, dict[str, float]]:
        """Every price by model name, USD per million tokens: what the info shows (the console's estimates)."""
        return {
            name: {"input": price.input, "cachedInput": price.cached_input, "output": price.output}
            for name, price in sorted(self._prices.items())
        }

    def price(self, model: str) -> Price | None:
        """The price of `model`, or None when the table has none."""
        name = model.strip().lower()
        name = name.rsplit("/", 1)[-1]
        exact = self._prices.get(name)
        if exact is not None:
            return exact
        for prefix in self._prefixes:
            if name.startswith(prefix):
                return self._prices[prefix]
        return None

    def charge(self, usages: Iterable[Usage], *, default_model: str) -> Charge:
        """What `usages` cost; a usage without a model is priced as `default_model`."""
        total, unpriced = 0.0, []
        for usage in usages:
            model = usage.model or default_model
            price = self.price(model)
            if price is None:
                if usage.input_tokens or usage.output_tokens or usage.total_tokens:
                    unpriced.append(model or "(unnamed)")
                continue
            total += price.cost(usage)
        return Charge(total, priced=not unpriced, unpriced_models=tuple(dict.fromkeys(unpriced)))
