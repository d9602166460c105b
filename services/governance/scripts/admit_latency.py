"""What governance's log adds to an admission's round trip, on a local nats-server.

Not run by the tests. Three arms, each governance's real responders with a rate limit in force
(so every decision carries counts), on a bus namespace of its own, asked through the bus one
admission at a time:

* `alone` — no log: the decision is committed to this replica's SQLite file before the answer
  (what a single governance did before the log);
* `log: stored` — the decision is stored in `ATMO_GOVERNANCE` before the answer; this replica
  applies it to its SQLite file afterwards (what governance does);
* `log: applied` — the answer also waits until this replica applied the decision (the
  alternative: `ReplicaLog.write`).

Blocks of each arm run interleaved in shuffled order; reported: p50, p95 and p99 per admission
and the p50 added over `alone`.

    .atmosphere/tools/bin/uv run --frozen --no-sync python services/governance/scripts/admit_latency.py \
        [--rounds 10] [--block 200]
"""

# ruff: noqa: T201 - a command-line report
from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from atmosphere.bus import Bus, JetStreamLayout, ServiceError, connect, subjects
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.governance.v1.governance_pb2 import (
    AdmitRequest,
    Decision,
    DecisionCounts,
    DecisionRecord,
    GovernanceLogEntry,
)
from atmosphere.governance.app import replicated
from atmosphere.governance.handlers import GovernanceHandlers
from atmosphere.governance.plane import GovernancePlane
from atmosphere.governance.policies import parse_policies
from atmosphere.governance.replication import GovernanceJournal, GovernanceLog, GovernanceReplica
from atmosphere.governance.store import DecisionLog
from atmosphere.service.replica import ReplicaLog, ReplicaPosition
from atmosphere.testing import NatsServer

POLICIES = "policies:\n  - {name: plenty, type: rate-limit, config: {limit: 100000000, window-seconds: 60}}\n"
ADA = Principal(user_id="ada", tenant="acme")


class AppliedJournal(GovernanceJournal):
    """The `log: applied` arm: a decision is answered once this replica applied it."""

    async def decided(self, record: DecisionRecord, counts: DecisionCounts | None = None) -> None:
        entry = self.replica.entry()
        entry.decision.record.CopyFrom(record)
        if counts is not None:
            entry.decision.counts.CopyFrom(counts)
            self.replica.counted_here(record.decision_id)
        await self.write(entry)


@contextlib.asynccontextmanager
async def serving(url: str, namespace: str, arm: str, db: Path) -> AsyncIterator[Bus]:
    """Governance's responders for `arm` on `namespace`; yields a client bus on the same namespace."""
    plane = GovernancePlane(parse_policies(POLICIES, source="bench"))
    async with contextlib.AsyncExitStack() as stack:
        decisions = await stack.enter_async_context(DecisionLog.open(db))
        server = await stack.enter_async_context(connect(url, name=f"governance-{arm}", namespace=namespace))
        await server.provision(JetStreamLayout())
        if arm == "alone":
            handlers = GovernanceHandlers(decisions, plane=plane, max_payload=server.max_payload)
        elif arm == "stored":
            handlers = await stack.enter_async_context(replicated(server, decisions, plane, replica="bench-stored"))
        else:  # as `replicated` wires it, with the journal that waits
            state = GovernanceReplica(decisions, plane, name="bench-applied")
            entries: GovernanceLog = ReplicaLog(
                server,
                stream=subjects.GOVERNANCE_LOG_STREAM,
                filter_subject=subjects.governance_log_all(),
                position=ReplicaPosition(None, "governance"),
                message_type=GovernanceLogEntry,
                apply=state.apply,
                outcomes=(ServiceError,),
            )
            journal = AppliedJournal(state, bus=server, log=entries)
            handlers = GovernanceHandlers(decisions, plane=plane, max_payload=server.max_payload, journal=journal)
            await stack.enter_async_context(entries.applying())
        await stack.enter_async_context(server.serve(handlers.router(), queue="governance"))
        yield await stack.enter_async_context(connect(url, name=f"client-{arm}", namespace=namespace))


async def block(client: Bus, size: int, into: list[float]) -> None:
    for _ in range(size):
        request = AdmitRequest(run_id=f"r{time.perf_counter_ns()}", agent="a", principal=ADA)
        started = time.perf_counter_ns()
        answer = await client.request(subjects.governance("admit"), request, Decision)
        into.append((time.perf_counter_ns() - started) / 1e6)
        if not answer.allowed:
            raise RuntimeError(f"refused: {answer.reason}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(rounds: int, size: int) -> None:
    arms = ("alone", "stored", "applied")
    with tempfile.TemporaryDirectory() as scratch:
        nats = NatsServer(Path(scratch) / "nats").start()
        try:
            async with contextlib.AsyncExitStack() as stack:
                clients = {
                    arm: await stack.enter_async_context(serving(nats.url, f"bench{arm}", arm, Path(scratch) / arm))
                    for arm in arms
                }
                times: dict[str, list[float]] = {arm: [] for arm in arms}
                for arm in arms:  # warm-up, dropped
                    await block(clients[arm], size, [])
                rng = random.Random(7)  # noqa: S311 - a shuffled order, not a secret
                for _ in range(rounds):
                    order = list(arms)
                    rng.shuffle(order)
                    for arm in order:
                        await block(clients[arm], size, times[arm])
        finally:
            nats.stop()
    base = statistics.median(times["alone"])
    print(f"admission round trip through the bus, ms ({rounds} rounds x {size} per arm)")
    for arm in arms:
        values = times[arm]
        p50 = statistics.median(values)
        print(
            f"  {arm:<8} p50 {p50:6.3f}  p95 {percentile(values, 0.95):6.3f}  p99 {percentile(values, 0.99):6.3f}"
            f"  added p50 {p50 - base:+6.3f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.block))
