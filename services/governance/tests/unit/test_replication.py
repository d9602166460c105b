"""Governance's log on a `FakeBus`: entries applied twice change nothing, replicas count each other's requests.

Each replica is what `serve()` runs (`app.replicated`: its own SQLite file and plane, applying
`ATMO_GOVERNANCE` through a `ReplicaLog`); a test asks one replica or the other by calling its
responders directly, which the bus's queue group cannot be told to do.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus import Headers, JetStreamLayout, MessageContext, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.common_pb2 import Principal, Usage
from atmosphere.contracts.governance.v1.governance_pb2 import (
    AdminRequest,
    AdminResponse,
    AdmitRequest,
    CheckOutputRequest,
    CheckToolCallRequest,
    Decision,
    DecisionCounts,
    DecisionRecord,
    GovernanceLogEntry,
    KillSwitchChange,
    ListDecisionsRequest,
    ListDecisionsResponse,
    RunEndedAck,
    RunEndedReport,
    RunSettled,
)
from atmosphere.governance.app import replicated
from atmosphere.governance.handlers import GovernanceHandlers
from atmosphere.governance.plane import GovernancePlane
from atmosphere.governance.policies import (
    ConcurrencyLimitPolicy,
    OutputLengthZScorePolicy,
    RateLimitPolicy,
    parse_policies,
)
from atmosphere.governance.pricing import Price, PricingTable
from atmosphere.governance.replication import GovernanceReplica
from atmosphere.governance.store import DecisionLog
from atmosphere.testing import wait_until

RATE = "policies:\n  - {name: three-a-minute, type: rate-limit, config: {limit: 3, window-seconds: 60}}\n"
SLOTS = "policies:\n  - {name: one-at-a-time, type: concurrency-limit, config: {max-concurrent: 1}}\n"
LENGTHS = "policies:\n  - {name: lengths, type: output-length-zscore, config: {window-size: 4, min-samples: 2}}\n"
BOTH = """\
policies:
  - {name: five-a-minute, type: rate-limit, config: {limit: 5, window-seconds: 60}}
  - {name: one-at-a-time, type: concurrency-limit, config: {max-concurrent: 1}}
"""
ADA = Principal(user_id="ada", tenant="acme")
CTX = MessageContext(subject="test", headers=Headers())


P = TypeVar("P")


def plane(policies: str) -> GovernancePlane:
    pricing = PricingTable({"m": Price(input=1_000_000.0, output=1_000_000.0, cached_input=0.0)})  # $1 a token
    return GovernancePlane(parse_policies(policies, source="yaml:p.yaml"), pricing=pricing)


def policy(gov: GovernancePlane, kind: type[P]) -> P:
    return next(p for p in gov.policies if isinstance(p, kind))


@dataclass
class Replica:
    handlers: GovernanceHandlers
    plane: GovernancePlane

    async def call(self, op: str, request: Message) -> Any:
        [route] = [r for r in self.handlers.router().routes if r.subject == subjects.governance(op)]
        return await route.handler(request, CTX)

    async def admit(self, run_id: str) -> Decision:
        answer: Decision = await self.call("admit", AdmitRequest(run_id=run_id, agent="a", principal=ADA))
        return answer

    async def end(self, run_id: str, tokens: int = 0) -> RunEndedAck:
        report = RunEndedReport(run_id=run_id, agent="a", principal=ADA, model="m", usage=[Usage(input_tokens=tokens)])
        ack: RunEndedAck = await self.call("run_ended", report)
        return ack

    async def admin(self, op: str, **body: object) -> Any:
        reply: AdminResponse = await self.call(f"admin.{op}", AdminRequest(body_json=json.dumps(body)))
        return json.loads(reply.result_json)

    async def decisions(self) -> list[tuple[str, str, str, bool]]:
        reply: ListDecisionsResponse = await self.call("decisions", ListDecisionsRequest(limit=100))
        return [(d.decision_id, d.run_id, d.operation, d.allowed) for d in reply.decisions]

    def hits(self) -> int:
        return sum(p.hits("user:ada") for p in self.plane.policies if isinstance(p, RateLimitPolicy))

    def in_flight(self) -> int:
        return policy(self.plane, ConcurrencyLimitPolicy).in_flight("user:ada")


@contextlib.asynccontextmanager
async def replica(bus: FakeBus, data: Path, name: str, policies: str) -> AsyncIterator[Replica]:
    gov = plane(policies)
    async with (
        DecisionLog.open(data / "governance.db") as decisions,
        replicated(bus, decisions, gov, replica=name) as h,
    ):
        yield Replica(h, gov)


async def provisioned() -> FakeBus:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    return bus


def stamp(seconds_ago: float = 0.0) -> Timestamp:
    at = Timestamp()
    at.FromMilliseconds(int((time.time() - seconds_ago) * 1000))
    return at


def admitted(
    decision_id: str, run_id: str, *, seconds_ago: float = 0.0, origin: str = "governance-elsewhere"
) -> GovernanceLogEntry:
    """An admission another replica logged: a rate-limit hit, and a slot held until the run ends."""
    digest = policy(plane(BOTH), RateLimitPolicy).identity.digest
    entry = GovernanceLogEntry(origin_replica=origin)
    entry.decision.record.CopyFrom(
        DecisionRecord(
            decision_id=decision_id,
            run_id=run_id,
            operation="admit",
            allowed=True,
            decided_at=stamp(seconds_ago),
            outcome="admit",
        )
    )
    entry.decision.counts.CopyFrom(DecisionCounts(user_id="ada", tenant="acme", rate_limits=[digest], holds_slot=True))
    return entry


async def test_the_same_entries_applied_twice_change_nothing(tmp_path: Path) -> None:
    gov = plane(BOTH)
    async with DecisionLog.open(tmp_path / "g.db") as decisions:
        state = GovernanceReplica(decisions, gov, name="governance-here")
        settled = GovernanceLogEntry(origin_replica="governance-elsewhere")
        settled.run_settled.CopyFrom(RunSettled(run_id="r1", tenant="acme", cost_usd=2.0, accounted_at_ms=1))
        armed = GovernanceLogEntry(origin_replica="governance-elsewhere")
        armed.kill_switch.CopyFrom(KillSwitchChange(armed=True, reason="incident", operator="oncall", at=stamp()))
        entries = [admitted("d1", "r1"), admitted("d2", "r2"), settled, armed]
        for _ in range(2):  # a replica killed before acknowledging applies the same entries again
            for seq, entry in enumerate(entries, start=1):
                await state.apply(seq, entry)
        rows = await decisions.recent(run_id="", limit=10)
        assert sorted(row.decision_id for row in rows) == ["d1", "d2"]
        assert policy(gov, RateLimitPolicy).hits("user:ada") == 2
        assert policy(gov, ConcurrencyLimitPolicy).in_flight("user:ada") == 1  # r1 ended, r2 holds its slot
        assert gov.held_slots == 1
        assert gov.spend == {"acme": 2.0}
        assert await decisions.spend_since(0) == {"acme": 2.0}
        assert gov.kill_switch.armed_reason == "incident"


async def test_an_entry_older_than_the_window_is_not_counted_and_a_recent_one_only_for_what_is_left(
    tmp_path: Path,
) -> None:
    now = [1000.0]
    limit = RateLimitPolicy(policy(plane(BOTH), RateLimitPolicy).identity, 5, 60, clock=lambda: now[0])
    async with DecisionLog.open(tmp_path / "g.db") as decisions:
        state = GovernanceReplica(decisions, GovernancePlane([limit]), name="governance-here")
        await state.apply(1, admitted("old", "r-old", seconds_ago=120))  # the window is 60 s
        await state.apply(2, admitted("recent", "r-recent", seconds_ago=30))
        assert limit.hits("user:ada") == 1
        assert len(await decisions.recent(run_id="", limit=10)) == 2  # both are logged all the same
    # Placed back by its age less the clock-skew allowance (29 s): it leaves the window 31 s on, not 60.
    now[0] += 30.5
    assert limit.hits("user:ada") == 1
    now[0] += 1.0
    assert limit.hits("user:ada") == 0


async def test_a_replica_counts_what_the_other_admitted_and_its_own_once(tmp_path: Path) -> None:
    bus = await provisioned()
    async with (
        replica(bus, tmp_path / "a", "governance-a", RATE) as a,
        replica(bus, tmp_path / "b", "governance-b", RATE) as b,
    ):
        assert (await a.admit("r1")).allowed
        assert (await b.admit("r2")).allowed
        assert (await a.admit("r3")).allowed
        await wait_until(lambda: _both(a, b, lambda r: r.hits() == 3), what="both replicas to count three admissions")
        assert not (await b.admit("r4")).allowed  # three a minute, whichever replica admitted them
        assert not (await a.admit("r5")).allowed
        assert await a.decisions() == await b.decisions()
        assert [d[2:] for d in await a.decisions()][:3] == [("admit", False), ("admit", False), ("admit", True)]


async def test_a_slot_taken_on_one_replica_is_freed_on_both_by_an_end_reported_to_the_other(tmp_path: Path) -> None:
    bus = await provisioned()
    async with (
        replica(bus, tmp_path / "a", "governance-a", SLOTS) as a,
        replica(bus, tmp_path / "b", "governance-b", SLOTS) as b,
    ):
        assert (await a.admit("r1")).allowed
        await wait_until(lambda: _both(a, b, lambda r: r.in_flight() == 1), what="the slot to be held on both")
        refused = await b.admit("r2")
        assert (refused.allowed, refused.policy) == (False, "one-at-a-time")
        # A tool call of the run neither needs a slot nor takes one.
        tool = await b.call("check_tool", CheckToolCallRequest(run_id="r1", tool_name="t", principal=ADA))
        assert tool.allowed
        await b.end("r1", tokens=2)
        await wait_until(lambda: _both(a, b, lambda r: r.in_flight() == 0), what="the slot to be free on both")
        assert (await a.admin("summary"))["spendUsdByTenant"] == {"acme": 2.0}
        assert (await b.admin("summary"))["heldConcurrencySlots"] == 0


async def test_a_run_refused_by_a_later_policy_gives_back_the_slot_an_earlier_limit_gave_it() -> None:
    gov = plane(SLOTS + "  - {name: no, type: deny-list, config: {phrases: [forbidden]}}\n")
    _, refused, counts = await gov.admit(AdmitRequest(run_id="r1", message="forbidden", principal=ADA))
    assert (refused.allowed, counts) == (False, None)
    assert policy(gov, ConcurrencyLimitPolicy).in_flight("user:ada") == 0
    _, fine, counts = await gov.admit(AdmitRequest(run_id="r2", message="fine", principal=ADA))
    assert fine.allowed
    assert counts is not None
    assert counts.holds_slot


async def test_answer_lengths_judged_on_one_replica_fill_the_window_of_the_other(tmp_path: Path) -> None:
    bus = await provisioned()
    async with (
        replica(bus, tmp_path / "a", "governance-a", LENGTHS) as a,
        replica(bus, tmp_path / "b", "governance-b", LENGTHS) as b,
    ):
        for n, length in enumerate((100, 110, 90)):
            answer = CheckOutputRequest(run_id=f"r{n}", principal=ADA, response="x" * length, final=True)
            assert (await (a if n % 2 else b).call("check_output", answer)).allowed

        def windows(r: Replica) -> tuple[int, ...]:
            return policy(r.plane, OutputLengthZScorePolicy).samples("acme")

        await wait_until(lambda: _both(a, b, lambda r: sorted(windows(r)) == [90, 100, 110]), what="one window")


async def test_the_kill_switch_armed_on_one_replica_stops_the_other_and_survives_its_restart(tmp_path: Path) -> None:
    bus = await provisioned()
    async with replica(bus, tmp_path / "a", "governance-a", RATE) as a:
        async with replica(bus, tmp_path / "b", "governance-b", RATE) as b:
            armed = await a.admin("arm", reason="incident 7", operator="oncall")
            assert armed["armed"]
            await wait_until(lambda: _both(a, b, lambda r: r.plane.kill_switch.armed), what="the switch on both")
            assert (await b.admit("r1")).reason == "incident 7"
        async with replica(bus, tmp_path / "b", "governance-b", RATE) as b:  # the same volume, started again
            assert (await b.admin("health"))["killSwitch"]["reason"] == "incident 7"
            await b.admin("disarm", operator="oncall")
        await wait_until(lambda: _async(not a.plane.kill_switch.armed), what="the switch off on a")


async def test_a_restarted_replica_rebuilds_its_counters_and_counts_nothing_twice(tmp_path: Path) -> None:
    bus = await provisioned()
    async with replica(bus, tmp_path / "a", "governance-a", BOTH) as a:
        assert (await a.admit("r1")).allowed
        assert not (await a.admit("r2")).allowed  # passed by the rate limit (a hit), refused by the slots
        await a.end("r1")
        assert (await a.admit("r3")).allowed  # holds its slot across the restart
    async with replica(bus, tmp_path / "b", "governance-b", BOTH) as b:  # meanwhile, another replica
        assert (b.hits(), b.in_flight()) == (3, 1)
        await b.end("r3")
        assert (await b.admit("r4")).allowed
    async with replica(bus, tmp_path / "a", "governance-a", BOTH) as a:
        # r1-r3 rebuilt from its own store, then r3's end and r4 applied on resuming the log.
        assert (a.hits(), a.in_flight()) == (4, 1)
        assert not (await a.admit("r5")).allowed  # r4 holds the one slot
    async with replica(bus, tmp_path / "fresh", "governance-fresh", BOTH) as fresh:  # a new volume
        assert (fresh.hits(), fresh.in_flight()) == (5, 1)
        assert len(await fresh.decisions()) == 5


async def _both(a: Replica, b: Replica, condition: Any) -> bool:
    return bool(condition(a) and condition(b))


async def _async(value: bool) -> bool:
    return value
