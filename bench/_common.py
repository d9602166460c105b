"""Shared bits of the benchmarks: interleaved rounds, medians, a results table."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field


@dataclass
class Arm:
    """One way of doing the same work; `run()` does one block and returns its work units.

    Each block records wall time and this process's CPU time per unit (µs), so the in-process
    cost is measured apart from the noise of a shared machine.
    """

    name: str
    run: Callable[[], Awaitable[int]]
    samples: list[float] = field(default_factory=list)
    """Wall µs per unit, one per round."""
    cpu_samples: list[float] = field(default_factory=list)
    """CPU µs per unit (this process: client and server sides), one per round."""

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu_samples)

    async def block(self) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        units = await self.run()
        return (time.perf_counter() - wall) / units * 1e6, (time.process_time() - cpu) / units * 1e6


async def interleave(arms: Sequence[Arm], *, rounds: int, warmup: int = 1, seed: int = 7) -> None:
    """Run every arm once per round in shuffled order; warm-up rounds are discarded."""
    rng = random.Random(seed)
    for index in range(warmup + rounds):
        order = list(arms)
        rng.shuffle(order)
        for arm in order:
            wall, cpu = await arm.block()
            if index >= warmup:
                arm.samples.append(wall)
                arm.cpu_samples.append(cpu)


def added(arm: Arm, baseline: Sequence[Arm], *, cpu: bool = False) -> list[float]:
    """Per-round difference between `arm` and the mean of the baseline arms (same round)."""
    series = [b.cpu_samples if cpu else b.samples for b in baseline]
    mine = arm.cpu_samples if cpu else arm.samples
    return [m - statistics.fmean(values) for m, *values in zip(mine, *series, strict=True)]


def iqr(values: Sequence[float]) -> tuple[float, float]:
    quartiles = statistics.quantiles(values, n=4)
    return quartiles[0], quartiles[2]
