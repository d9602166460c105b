"""What governance costs a run: a tool call's check, and a streamed answer's checks, against no policies.

The real responders (`GovernanceHandlers`, each with its own `DecisionLog` on a temp SQLite file)
serve on a local nats-server, one under the bus namespace `bench-none` with no policies
(`GovernancePlane(())`: only the kill switch) and one under `bench-five` with five policies
parsed from YAML (a deny-list with a regex, pii-redaction, a rate limit that never trips, an
authorization that admits, and a Microsoft-schema document with rules on `tool_name`). Clients
ask through dispatch's own `GovernanceClient`, in this process, so each figure is a whole round
trip: encode, broker, evaluate, log, answer.

Part 1, tool-call check (`atmo.gov.check_tool`): arms "no policies" (twice, as an A/A control)
and "five policies", interleaved in shuffled blocks. Reported: pooled p50/p95 per check, the
per-round difference of the block p50s (five policies minus the no-policy mean) with its IQR,
the ratio, and the ring's own in-process evaluation time (`plane.ring.evaluate`).

Part 2, streamed answer: a 20,000-character answer in 4-character deltas through dispatch's
`OutputGuard`, whose checks ask the five-policy governance (`atmo.gov.check_output`), against the
same deltas forwarded with no guard. Reported: the checks made (chars / 200 + 1 expected), the
time per answer, and the per-delta cost beyond the checks,
(total - checks x check p50) / deltas, next to the baseline's per-delta cost.

Targets (issue 12): governance adds <= 0.3 ms p50 per tool-call check; a streamed answer pays
one check per 200 characters (plus the final one) and nothing per delta beyond them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Arm, interleave, iqr

from atmosphere.bus import Bus, connect
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.governance.v1.governance_pb2 import CheckToolCallRequest, Decision
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, RunSubmission, TextDelta
from atmosphere.dispatch.governance_client import GovernanceClient
from atmosphere.dispatch.output_guard import CHECK_EVERY, OutputGuard
from atmosphere.governance.handlers import GovernanceHandlers
from atmosphere.governance.plane import GovernancePlane, tool_context
from atmosphere.governance.policies import Policy, parse_policies
from atmosphere.governance.store import DecisionLog
from atmosphere.service import loop_factory
from atmosphere.testing import NatsServer

NATIVE_POLICIES = r"""
version: bench-1
policies:
  - name: no-destructive-commands
    type: deny-list
    config:
      phrases: ['drop table', 'format c:']
      regex: ['rm\s+-rf\s+/', 'curl\s+[^|]*\|\s*(ba)?sh']
  - name: pii
    type: pii-redaction
  - name: tool-rate
    type: rate-limit
    config: {limit: 100000000, window-seconds: 60}
  - name: analysts-only
    type: authorization
    config: {required-roles: [analyst]}
"""
"""Four native-schema policies; the rate limit is far above what the bench sends, so it never trips."""

MS_POLICY = r"""
name: tool-rules
version: "1.0"
rules:
  - name: no-shell
    condition: {field: tool_name, operator: in, value: [shell_exec, delete_all]}
    action: deny
    priority: 10
    message: shell tools are not allowed
  - name: no-admin-tools
    condition: {field: tool_name, operator: matches, value: '^admin_'}
    action: deny
defaults: {action: allow}
"""
"""The fifth policy: a Microsoft-schema document is one document of its own, so it is parsed apart."""

RUN = RunSubmission(
    run_id="0123456789abcdef0123456789abcdef",
    session_id="s" * 36,
    conversation_id="c" * 36,
    agent="assistant",
    message="Summarise last quarter's revenue by region.",
    principal=Principal(user_id="u-42", name="Ada", auth_method="bearer", roles=["analyst"], tenant="acme"),
    transport="websocket",
)
TOOL = "search_documents"
ARGUMENTS = '{"query": "quarterly revenue by region", "limit": 5, "filters": {"year": 2024, "unit": "EUR"}}'
SENTENCE = "The quarterly figures show steady growth across every region, with the strongest gains in the north. "
DELTA_CHARS = 4


def five_policies() -> list[Policy]:
    """The loaded arm's policies, parsed as governance parses policy files."""
    return [
        *parse_policies(NATIVE_POLICIES, source="yaml:bench/native"),
        *parse_policies(MS_POLICY, source="yaml:bench/ms"),
    ]


def answer_text(chars: int) -> str:
    """An answer of exactly `chars` characters of plain words (nothing any policy stops)."""
    return (SENTENCE * (chars // len(SENTENCE) + 1))[:chars]


def percentile(values: Sequence[float], share: float) -> float:
    """The `share` (0..1) quantile of `values` by the nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


@dataclass
class ToolArm:
    """Blocks of sequential tool-call checks against one governance; every check's latency (ms) kept."""

    name: str
    client: GovernanceClient
    checks: int
    blocks: list[list[float]] = field(default_factory=list)

    async def run(self) -> int:
        latencies: list[float] = []
        for _ in range(self.checks):
            started = time.perf_counter_ns()
            decision = await self.client.check_tool(RUN, TOOL, ARGUMENTS)
            latencies.append((time.perf_counter_ns() - started) / 1e6)
            if not decision.allowed:  # a deny is a different (shorter) path: the figures would mean nothing
                raise RuntimeError(f"{self.name}: the benchmark's tool call was denied: {decision.reason}")
        self.blocks.append(latencies)
        return self.checks

    @property
    def all(self) -> list[float]:
        return [value for block in self.blocks for value in block]

    @property
    def block_p50s(self) -> list[float]:
        return [statistics.median(block) for block in self.blocks]


@dataclass
class StreamArm:
    """Blocks of one streamed answer each: with the output guard (`client` set) or forwarded as they come."""

    name: str
    answer: str
    client: GovernanceClient | None
    totals_ms: list[float] = field(default_factory=list)
    """Per answer: from its first delta in to its last event out."""
    answers: list[list[float]] = field(default_factory=list)
    """Per answer: its checks' round trips (ms), in order (each check sends the whole answer so far)."""

    def deltas(self) -> list[RunEvent]:
        # Fresh events per answer: the guard splits held events in place when it releases part of one.
        return [
            RunEvent(run_id=RUN.run_id, text_delta=TextDelta(text=self.answer[i : i + DELTA_CHARS]))
            for i in range(0, len(self.answer), DELTA_CHARS)
        ]

    async def run(self) -> int:
        events = self.deltas()
        out: list[RunEvent] = []
        started = time.perf_counter_ns()
        if self.client is None:
            for event in events:
                out.append(event)
        else:
            checks: list[float] = []
            guard = OutputGuard(self._timed_check(self.client, checks), run_id=RUN.run_id)
            for event in events:
                out.extend(await guard.text(event))
            out.extend(await guard.before(final=True))
            self.answers.append(checks)
        self.totals_ms.append((time.perf_counter_ns() - started) / 1e6)
        if "".join(event.text_delta.text for event in out) != self.answer:
            raise RuntimeError(f"{self.name}: the answer that came out is not the answer that went in")
        return len(events)

    @property
    def check_ms(self) -> list[float]:
        """Every check's round trip, pooled over the answers."""
        return [value for checks in self.answers for value in checks]

    @property
    def beyond_checks_ms(self) -> list[float]:
        """Per answer: its total minus the sum of its own checks' measured round trips."""
        return [total - sum(checks) for total, checks in zip(self.totals_ms, self.answers, strict=True)]

    @staticmethod
    def _timed_check(client: GovernanceClient, into: list[float]) -> Callable[[str, int, bool], Awaitable[Decision]]:
        async def check(tail: str, length: int, final: bool) -> Decision:
            started = time.perf_counter_ns()
            decision = await client.check_output(RUN, tail, length=length, final=final)
            into.append((time.perf_counter_ns() - started) / 1e6)
            return decision

        return check


@contextlib.asynccontextmanager
async def governance(url: str, namespace: str, plane: GovernancePlane, db: Path) -> AsyncIterator[None]:
    """The real responders for `plane` on the bus namespace `namespace`, logging to `db`."""
    async with (
        DecisionLog.open(db) as log,
        connect(url, name=f"governance-{namespace}", namespace=namespace) as bus,
        bus.serve(GovernanceHandlers(log, plane=plane, max_payload=bus.max_payload).router(), queue="governance"),
    ):
        yield


async def sanity(none: GovernanceClient, five: GovernanceClient) -> None:
    """The loaded arm really evaluates its policies: a shell tool is denied there and admitted without them."""
    denied = await five.check_tool(RUN, "shell_exec", '{"cmd": "ls"}')
    admitted = await none.check_tool(RUN, "shell_exec", '{"cmd": "ls"}')
    if denied.allowed or denied.policy != "tool-rules" or not admitted.allowed:
        msg = f"policies not in force as expected: five={denied.policy}/{denied.allowed}, none={admitted.allowed}"
        raise RuntimeError(msg)


def ring_p50_us(plane: GovernancePlane, evaluations: int) -> float:
    """The in-process ring evaluation of the benchmark's tool call, p50 in µs."""
    context = tool_context(
        CheckToolCallRequest(
            run_id=RUN.run_id, agent=RUN.agent, tool_name=TOOL, arguments_json=ARGUMENTS, principal=RUN.principal
        )
    )
    times: list[float] = []
    for _ in range(evaluations):
        started = time.perf_counter_ns()
        evaluation = plane.ring.evaluate(context)
        times.append((time.perf_counter_ns() - started) / 1e3)
        if not evaluation.allowed:
            raise RuntimeError(f"the ring denied the benchmark's tool call: {evaluation.decision}")
    return statistics.median(times)


async def warm_then_interleave(arms: Sequence[ToolArm | StreamArm], rounds: int) -> None:
    """One warm-up block per arm (dropped), then `rounds` shuffled rounds (kept by the arms themselves)."""
    for arm in arms:
        await arm.run()
    for arm in arms:
        if isinstance(arm, ToolArm):
            arm.blocks.clear()
        else:
            arm.totals_ms.clear()
            arm.answers.clear()
    await interleave([Arm(arm.name, arm.run) for arm in arms], rounds=rounds, warmup=0)


def report_tool_checks(none: ToolArm, control: ToolArm, five: ToolArm, ring_none: float, ring_five: float) -> float:
    """Print part 1; the added p50 in ms."""
    print("tool-call check (atmo.gov.check_tool round trip), ms per check (lower is better)")
    for arm in (none, control, five):
        values = arm.all
        print(f"  {arm.name:<24} p50 {statistics.median(values):7.3f}   p95 {percentile(values, 0.95):7.3f}")
    baseline = [statistics.fmean(pair) for pair in zip(none.block_p50s, control.block_p50s, strict=True)]
    added = [mine - base for mine, base in zip(five.block_p50s, baseline, strict=True)]
    noise = [b - a for a, b in zip(none.block_p50s, control.block_p50s, strict=True)]
    ratios = [mine / base for mine, base in zip(five.block_p50s, baseline, strict=True)]
    lo, hi = iqr(added)
    print(
        f"  added by five policies: p50 {statistics.median(added):+.3f} ms (IQR {lo:+.3f}..{hi:+.3f}),"
        f" ratio {statistics.median(ratios):.2f}; A/A noise {statistics.median(noise):+.3f} ms"
    )
    print(f"  ring evaluation in process: p50 {ring_five:.1f} µs (five policies), {ring_none:.1f} µs (none)")
    return statistics.median(added)


def report_stream(guarded: StreamArm, plain: StreamArm) -> tuple[bool, float]:
    """Print part 2; whether the check count is as expected, and the added per-delta µs beyond the checks."""
    chars, deltas = len(guarded.answer), len(guarded.deltas())
    expected = chars // CHECK_EVERY + 1
    checks = statistics.median(len(answer) for answer in guarded.answers)
    first = statistics.median(answer[0] for answer in guarded.answers)
    # The last streamed check sees (nearly) the whole answer; the final one also writes the decision log.
    last = statistics.median(answer[-2] for answer in guarded.answers)
    final = statistics.median(answer[-1] for answer in guarded.answers)
    check_p50 = statistics.median(guarded.check_ms)
    total = statistics.median(guarded.totals_ms)
    base_total = statistics.median(plain.totals_ms)
    beyond_us = (total - checks * check_p50) / deltas * 1e3
    # The checks grow with the answer (each sends all of it), so their mean is above their p50; the
    # sum of an answer's own measured checks is the exact split, shown next to the p50 estimate.
    exact_us = statistics.median(guarded.beyond_checks_ms) / deltas * 1e3
    base_us = base_total / deltas * 1e3
    print(f"\nstreamed answer: {chars} characters in {deltas} deltas of {DELTA_CHARS}")
    print(
        f"  checks per answer {checks:.0f} (chars/{CHECK_EVERY} + 1 = {expected}): {checks / expected:.2f} of expected"
    )
    print(
        f"  check_output ms: p50 {check_p50:.3f}, mean {statistics.fmean(guarded.check_ms):.3f},"
        f" p95 {percentile(guarded.check_ms, 0.95):.3f}; first ({CHECK_EVERY} chars) {first:.3f},"
        f" last streamed {last:.3f}, final (logged) {final:.3f}"
    )
    print(f"  {plain.name:<24} {base_total:9.3f} ms per answer   {base_us:7.3f} µs per delta")
    print(
        f"  {guarded.name:<24} {total:9.3f} ms per answer   {beyond_us:7.3f} µs per delta beyond checks x p50"
        f"   (ratio {total / base_total:.0f}x per answer)"
    )
    print(f"  {'':24} {'':9}{'':17}{exact_us:7.3f} µs per delta beyond the answer's own measured checks")
    return all(len(answer) == expected for answer in guarded.answers), exact_us - base_us


async def main(rounds: int, checks: int, stream_rounds: int, chars: int) -> int:
    with tempfile.TemporaryDirectory() as scratch:
        server = NatsServer(Path(scratch) / "nats").start()
        try:
            return await _bench(server.url, Path(scratch), rounds, checks, stream_rounds, chars)
        finally:
            server.stop()


async def _bench(url: str, scratch: Path, rounds: int, checks: int, stream_rounds: int, chars: int) -> int:
    plane_none, plane_five = GovernancePlane(()), GovernancePlane(five_policies())
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(governance(url, "bench-none", plane_none, scratch / "none.db"))
        await stack.enter_async_context(governance(url, "bench-five", plane_five, scratch / "five.db"))
        bus_none: Bus = await stack.enter_async_context(connect(url, name="dispatch-none", namespace="bench-none"))
        bus_five: Bus = await stack.enter_async_context(connect(url, name="dispatch-five", namespace="bench-five"))
        none, five = GovernanceClient(bus_none), GovernanceClient(bus_five)
        await sanity(none, five)

        tool_arms = (ToolArm("no policies", none, checks), ToolArm("no policies (A/A)", none, checks))
        loaded = ToolArm("five policies", five, checks)
        await warm_then_interleave([*tool_arms, loaded], rounds)
        ring_none, ring_five = ring_p50_us(plane_none, 5000), ring_p50_us(plane_five, 5000)

        answer = answer_text(chars)
        guarded, plain = StreamArm("output guard (5 pol.)", answer, five), StreamArm("no guard", answer, None)
        await warm_then_interleave([guarded, plain], stream_rounds)

    print(f"\ngovernance_overhead: {rounds} rounds of {checks} checks per arm; {stream_rounds} streamed answers\n")
    added_ms = report_tool_checks(*tool_arms, loaded, ring_none, ring_five)
    checks_ok, beyond_us = report_stream(guarded, plain)
    print(
        f"\ntargets: added p50 per tool-call check <= 0.3 ms: {'PASS' if added_ms <= 0.3 else 'FAIL'}"
        f" ({added_ms:+.3f}); answer checks = chars/{CHECK_EVERY} + 1: {'PASS' if checks_ok else 'FAIL'};"
        f" added per delta beyond the checks {beyond_us:+.3f} µs (vs no guard)"
    )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15, help="shuffled rounds of tool-call checks")
    parser.add_argument("--checks", type=int, default=200, help="tool-call checks per arm per round")
    parser.add_argument("--stream-rounds", type=int, default=9, help="streamed answers per arm")
    parser.add_argument("--chars", type=int, default=20_000, help="characters of the streamed answer")
    args = parser.parse_args()
    if min(args.rounds, args.stream_rounds) < 2 or args.checks < 1 or args.chars < 2 * CHECK_EVERY:
        parser.error(f"needs at least 2 rounds, 1 check per block and {2 * CHECK_EVERY} characters")
    # Governance and dispatch run on uvloop when it is installed; so do both sides here.
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        raise SystemExit(runner.run(main(args.rounds, args.checks, args.stream_rounds, args.chars)))
