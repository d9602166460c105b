"""Budgets: counting a run's usage and wall clock against its `AiBudget`."""

from __future__ import annotations

from dataclasses import dataclass

from atmosphere.contracts.common.v1.common_pb2 import Usage
from atmosphere.sdk import AiBudget
from atmosphere.sdk.host import BudgetReason


class BudgetExceededError(Exception):
    """A limit was crossed; the message is the wire text of the error frame."""

    def __init__(self, reason: BudgetReason, observed: float, limit: float) -> None:
        name, unit = reason.value
        self.reason = reason
        super().__init__(f"AI budget exceeded: {name} observed={observed:g}{unit} > limit={limit:g}{unit}")


@dataclass
class BudgetMeter:
    """Usage of one run so far; `add` raises on the first limit crossed."""

    budget: AiBudget
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    steps: int = 0

    def add(self, usage: Usage) -> None:
        """Count one usage report (one step); check input, output, total, steps in that order."""
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
                raise BudgetExceededError(reason, observed, limit)
