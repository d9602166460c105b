"""256 KiB of hostile near-matches through every probe finishes: the probes are linear by construction.

Why linear: each probe is a fixed sequence of literals and *bounded* windows (`.{0,40}`, `.{0,200}`)
with no nested or adjacent unbounded quantifiers over overlapping classes, so the work per start
position is bounded by a constant; the one unbounded run (`system-prompt-spoof`'s leading blanks
and its key lookahead) is tried only at line starts and never crosses a line break, so all attempts
together read each character a bounded number of times. No timing is asserted (the machine is
shared): a catastrophic pattern would not finish within the suite's per-test timeout instead.
"""

from __future__ import annotations

import pytest

from atmosphere.governance.injection import Verdict
from atmosphere.governance.screens import MAX_SCANNED_CHARS, RuleBasedClassifier

N = MAX_SCANNED_CHARS


def fill(unit: str) -> str:
    return (unit * (N // len(unit) + 1))[:N]


@pytest.mark.parametrize(
    "text",
    [
        fill("\n"),
        fill(" "),
        fill("\t \n"),
        fill("ignore previous "),  # the override probes' first two parts, never a third
        fill("ignore " + "previous system above prior " * 2),
        fill("```system "),
        fill("you are "),
        fill("system\n"),
        fill("    user: "),  # the key lookahead at every line start... of one endless line
        fill("\n    user: a b"),
        fill("print all "),
        fill("reveal hidden,"),
        fill("call tool "),
        fill("DAN" + "x"),
    ],
)
async def test_hostile_input_of_256_kib_finishes(text: str) -> None:
    assert len(text) == N
    result = await RuleBasedClassifier().classify(text)
    assert result.verdict in {Verdict.SAFE, Verdict.INJECTED}
