"""CPU time of the system under test from /proc, per process and per token it delivered.

Read from outside the processes (`/proc/<pid>/stat`), so the services run unmodified and the
figure covers every thread of each process, its live descendants and its reaped children.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

TICKS = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """`pid` and its live descendants."""
    found, index = [pid], 0
    while index < len(found):
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{found[index]}/task"):
                with open(f"/proc/{found[index]}/task/{task}/children") as children:
                    found += [int(child) for child in children.read().split()]
        index += 1
    return found


def _own_and_reaped_ticks(pid: int) -> int:
    """utime + stime + cutime + cstime of one process, in clock ticks (0 once it is gone).

    cutime/cstime hold only children that ended and were waited for, so adding them to the
    live descendants' own times counts every process once.
    """
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as stat:
        # The command name (field 2) may hold spaces and parentheses: split after its last ")".
        fields = stat.read().rsplit(")", 1)[1].split()
        return sum(int(value) for value in fields[11:15])
    return 0


def cpu_seconds(roots: list[int]) -> float:
    """User + system CPU seconds of the processes under `roots` (each process counted once)."""
    return sum(_own_and_reaped_ticks(pid) for pid in {p for root in roots for p in tree(root)}) / TICKS


def _micros(value: float) -> str:
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"


def per_token_line(spent: dict[str, float], tokens: int, rounds: Sequence[float] = ()) -> str:
    """`CPU per token (µs): dispatch 310, tape 140 — total 450 (rounds 430-480)`.

    `spent` is CPU seconds by process over all rounds; `rounds` the total µs per token of each
    round, whose range shows how much a shared machine moved the figure within the run.
    """
    if not tokens:
        return "CPU per token (µs): no tokens delivered"
    split = ", ".join(f"{name} {_micros(seconds / tokens * 1e6)}" for name, seconds in spent.items())
    spread = f" (rounds {_micros(min(rounds))}-{_micros(max(rounds))})" if len(rounds) > 1 else ""
    return f"CPU per token (µs): {split} — total {_micros(sum(spent.values()) / tokens * 1e6)}{spread}"


@dataclass
class CpuMeter:
    """CPU spent by named processes over the measured blocks, and the tokens those blocks delivered."""

    processes: dict[str, int]
    """Process name → pid, in the order the report lists them."""
    spent: dict[str, float] = field(default_factory=dict)
    """CPU seconds by process over the blocks recorded so far."""
    tokens: int = 0
    rounds: list[float] = field(default_factory=list)
    """Total CPU µs per token of each recorded block."""

    def read(self) -> dict[str, float]:
        """CPU seconds of each process now (a mark to pass to `record`)."""
        return {name: cpu_seconds([pid]) for name, pid in self.processes.items()}

    def record(self, mark: dict[str, float], tokens: int) -> None:
        """Add the CPU spent since `mark` and the `tokens` delivered meanwhile."""
        used = {name: spent - mark[name] for name, spent in self.read().items()}
        for name, spent in used.items():
            self.spent[name] = self.spent.get(name, 0.0) + spent
        self.tokens += tokens
        if tokens:
            self.rounds.append(sum(used.values()) / tokens * 1e6)

    def line(self) -> str:
        return per_token_line(self.spent, self.tokens, self.rounds)
