"""Budgets: counting a run's usage and wall clock against its `AiBudget`."""

from __future__ import annotations

from dataclasses import dataclass

from atmosphere.bus.errors import BudgetExceededError
from atmosphere.contracts.common.v1.common_pb2 import Usage
from atmosphere.sdk import AiBudget
from atmosphere.sdk.host import BudgetReason


def budget_breach(reason: BudgetReason, observed: float, limit: float) -> BudgetExceededError:
    """The error a run ends with when `observed` crossed `limit` (Atmosphere's wording)."""
    name, unit = reason.value
    return BudgetExceededError(f"AI budget exceeded: {name} observed={observed:g}{unit} > limit={limit:g}{unit}")


@dataclass
class BudgetMeter:
    """Usage of one run so far; `add` tells the first limit crossed."""

    budget: AiBudget
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    steps: int = 0

    def add(self, usage: Usage) -> BudgetExceededError | None:
        """Count one usage report (one step); the breach of input, output, total, steps in that order."""
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        self.total_tokens += usage.total_tokens or usage.input_tokens + usage.output_tokens
        self.steps += 1
        budget = self.budget
        checks = (
            (BudgetReason.INPUT_TOKENS, self.input_tokens, budget.max_input_tokens),
            (BudgetReason.OUTPUT_TOKENS, self.output_tokens, budget.max_output_tokens),
            (BudgetReason.TOTAL_TOKENS, self.total_tokens, budget.max_total_tokens),
            (BudgetReason.STEPS, self.steps, budget.max_steps),
        )
        for reason, observed, limit in checks:
            if limit is not None and limit > 0 and observed > limit:
                return budget_breach(reason, observed, limit)
        return None
