"""Governance with N replicas: one decision log and one set of counters, through governance's log.

Every decision, run end, kill-switch change and policy reload is an entry (`GovernanceLogEntry`)
of the stream `ATMO_GOVERNANCE`; every replica applies every entry, in stream order, to its own
SQLite store and counters (`atmosphere.service.replica.ReplicaLog`). What that guarantees:

- **Decision log, cost, kill switch, policies: one state.** Every replica applies the same
  entries in the same order: a decision is one row, stored once by its id (an entry applied twice
  changes nothing); a run's end gives back its slot and accounts its cost once per run id; a
  switch or reload takes effect everywhere. A read (`atmo.gov.decisions`, admin `summary`,
  `policies`, `health`) first waits until this replica applied all the stream held when the read
  began, so whichever replica answers, it answers with everything acknowledged before the read.
- **Answers wait for the stream, not for the replicas.** An admission or check is answered once
  its decision is stored in the stream (JetStream's acknowledgement; no replica's apply is
  awaited). A run's end, a switch and a reload are answered once stored and applied by the
  replica that took them: the next request there sees them, the others within the log's delivery
  latency.
- **Counters converge.** The replica that takes a request decides with its own counters,
  synchronously, as a single governance does; what its rate limits, concurrency limits and
  output-length windows counted travels with the decision (`counting.py`) and every other replica
  counts the same when it applies it. Limits are exact per replica and converge across replicas
  within the log's delivery latency: a burst split across replicas inside that latency can pass a
  limit by the requests admitted elsewhere meanwhile. A request whose decision could not be
  stored was counted by its replica only (and answered with an error).
- **Clocks.** Counters run on monotonic clocks, which differ between hosts and cannot travel: a
  hit counted elsewhere is placed on this replica's own clock at apply time, moved back by its
  age by the wall clocks (the decision's time) less `CLOCK_SKEW`. So a live entry counts from
  when it arrived, and a window never ends here before it ends where the request was admitted
  (only later, by the delivery latency), whatever the hosts' wall clocks say within the skew; an
  entry applied late (a replica catching up) counts for what is left of its window, or not at all.
- **Restarts.** Counters live in memory. At start a replica rebuilds them from its own store (its
  decisions keep what they counted, its run ends say which slots are free), then resumes the log
  where its volume left off: nothing is counted twice, neither an entry applied again after a
  crash (stored once) nor this process's own decisions (counted when decided). A new volume
  applies the stream from its start (it keeps 30 days), counting only what is inside a window.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus import subjects
from atmosphere.contracts.governance.v1.governance_pb2 import (
    DecisionCounts,
    DecisionRecord,
    GovernanceLogEntry,
    KillSwitchChange,
    LoggedDecision,
    PolicyReload,
    RunSettled,
)
from atmosphere.governance.errors import GovernanceBadRequestError
from atmosphere.governance.plane import GovernancePlane
from atmosphere.governance.policies import PolicyFileError
from atmosphere.governance.store import COST_WINDOW_DAYS, ArmedSwitch, DecisionLog, DecisionRow
from atmosphere.service.replica import ReplicaLog

log = logging.getLogger("atmosphere.governance")

CLOCK_SKEW = 1.0
"""Seconds by which two hosts' wall clocks may differ: an entry younger than this counts from when it
arrived, so a clock ahead of ours never ends a window here early."""
MAX_COUNTED_HERE = 100_000
"""Decisions this process counted and has not applied yet (one whose entry was never stored stays)."""
MAX_REASON_CHARS = 1024

GovernanceLog = ReplicaLog[GovernanceLogEntry, Any]


def row_of(record: DecisionRecord) -> DecisionRow:
    """The decision log's row of a logged decision."""
    return DecisionRow(
        decision_id=record.decision_id,
        run_id=record.run_id,
        operation=record.operation,
        subject=record.subject,
        allowed=record.allowed,
        policy=record.policy,
        reason=record.reason,
        principal=record.principal,
        decided_at=record.decided_at.ToMilliseconds(),
        policy_source=record.policy_source,
        policy_version=record.policy_version,
        policy_digest=record.policy_digest,
        outcome=record.outcome,
        evaluation_ms=record.evaluation_ms,
        context_json=record.context_json or "{}",
    )


def record_of(row: DecisionRow) -> DecisionRecord:
    """A stored row as the decision log lists it."""
    decided = Timestamp()
    decided.FromMilliseconds(row.decided_at)
    return DecisionRecord(
        decision_id=row.decision_id,
        run_id=row.run_id,
        operation=row.operation,
        subject=row.subject,
        allowed=row.allowed,
        policy=row.policy,
        reason=row.reason,
        decided_at=decided,
        principal=row.principal,
        policy_source=row.policy_source,
        policy_version=row.policy_version,
        policy_digest=row.policy_digest,
        outcome=row.outcome or ("admit" if row.allowed else "deny"),
        evaluation_ms=row.evaluation_ms,
        context_json=row.context_json,
    )


def log_subject(entry: GovernanceLogEntry) -> str:
    """Where `entry` is stored: `atmo.govlog.<kind>` (`decision`, `run_settled`, `kill_switch`, `reload`)."""
    return subjects.governance_log(entry.WhichOneof("entry") or "unknown")


class GovernanceReplica:
    """This replica's governance state, changed only by applying the log's entries (`apply`)."""

    def __init__(
        self,
        decisions: DecisionLog,
        plane: GovernancePlane,
        *,
        name: str = "governance",
        wall: Callable[[], float] = time.time,
    ) -> None:
        """Apply entries to `decisions` and `plane` as replica `name`; `wall` is the wall clock (epoch seconds)."""
        self.name = name
        self._decisions = decisions
        self._plane = plane
        self._wall = wall
        self._counted: OrderedDict[str, None] = OrderedDict()

    def entry(self) -> GovernanceLogEntry:
        """An empty entry written by this replica."""
        return GovernanceLogEntry(origin_replica=self.name)

    def counted_here(self, decision_id: str) -> None:
        """This process counted the decision when it decided: applying it must not count it again."""
        self._counted[decision_id] = None
        while len(self._counted) > MAX_COUNTED_HERE:
            self._counted.popitem(last=False)

    def _age(self, at_ms: int) -> float:
        """How long ago `at_ms` was by the wall clocks, less the skew they may have (never negative)."""
        return max(0.0, self._wall() - at_ms / 1000 - CLOCK_SKEW)

    # -- applying the log ----------------------------------------------------------------------

    async def apply(self, seq: int, entry: GovernanceLogEntry) -> Any:
        """Apply entry `seq` of the log: the same entries in the same order give every replica one state.

        Raises `GovernanceBadRequestError` for an entry every replica refuses alike (a reload that
        does not parse) or does not know (written by a newer version: skipped).
        """
        kind = entry.WhichOneof("entry")
        if kind == "decision":
            return await self._decision(seq, entry.decision)
        if kind == "run_settled":
            return await self._settle(seq, entry.run_settled)
        if kind == "kill_switch":
            return await self._switch(entry.kill_switch)
        if kind == "reload":
            return await self._reload(entry.reload)
        raise GovernanceBadRequestError(f"not a governance log entry this version knows: {kind}")

    async def _decision(self, seq: int, logged: LoggedDecision) -> None:
        record = logged.record
        counts = logged.counts if logged.HasField("counts") else None
        stored = await self._decisions.append(
            row_of(record), log_seq=seq, counts=counts.SerializeToString() if counts is not None else b""
        )
        decided_here = record.decision_id in self._counted
        self._counted.pop(record.decision_id, None)
        # Stored before (applied again after a crash): counted then, or by the rebuild at start.
        if stored and counts is not None and not decided_here:
            self._plane.observe(record.run_id, counts, age=self._age(record.decided_at.ToMilliseconds()))

    async def _settle(self, seq: int, settled: RunSettled) -> None:
        self._plane.settle(settled.run_id)
        await self._decisions.record_end(settled.run_id, log_seq=seq, at_ms=settled.accounted_at_ms)
        # The ledger first: the run's cost is accounted once, whoever reported its end how often.
        if settled.cost_usd > 0 and await self._decisions.record_cost(
            settled.run_id, settled.tenant, settled.cost_usd, at_ms=settled.accounted_at_ms
        ):
            self._plane.account(settled.run_id, settled.tenant, settled.cost_usd)

    async def _switch(self, change: KillSwitchChange) -> dict[str, Any]:
        if not change.armed:
            await self._decisions.save_switch(None)
            return self._plane.disarm(change.operator)
        at = change.at.ToMilliseconds()
        await self._decisions.save_switch(ArmedSwitch(change.reason, change.operator, at))
        return self._plane.arm(change.reason, change.operator, at=_moment(at))

    async def _reload(self, reload: PolicyReload) -> dict[str, Any]:
        try:
            result = self._plane.reload(swap_name=reload.swap_name, text=reload.yaml)
        except PolicyFileError as exc:
            raise GovernanceBadRequestError(f"Reload refused, nothing changed: {exc}"[:MAX_REASON_CHARS]) from None
        # Kept for this replica's next start (a full reload re-reads the files: no swap is left).
        await self._decisions.save_swap(swap_name=reload.swap_name, text=reload.yaml)
        return result

    # -- starting again ------------------------------------------------------------------------

    async def restore(self) -> None:
        """Take up what this replica applied before it stopped: swaps, the switch, spend, counters."""
        for name, text in await self._decisions.swaps():
            try:
                self._plane.reload(swap_name=name, text=text)
            except PolicyFileError as exc:  # the files changed under it since
                log.warning("policy swap %s no longer applies and is left out: %s", name, exc)
        armed = await self._decisions.switch()
        if armed is not None:
            self._plane.arm(armed.reason, armed.operator, at=_moment(armed.armed_at))
        cutoff = int((self._wall() - COST_WINDOW_DAYS * 86_400) * 1000)
        self._plane.restore_spend(await self._decisions.spend_since(cutoff))
        ends = await self._decisions.run_ends()
        for row in await self._decisions.counted():
            counts = DecisionCounts.FromString(row.counts)
            if counts.holds_slot and ends.get(row.run_id, -1) > row.log_seq:
                counts.holds_slot = False  # the run ended after this admission: its slot is free
            self._plane.observe(row.run_id, counts, age=self._age(row.decided_at))


def _moment(at_ms: int) -> datetime:
    return datetime.fromtimestamp(at_ms / 1000, UTC)


class GovernanceJournal:
    """Where the responders put what changes governance's state: the log, or (alone) this replica at once."""

    def __init__(self, replica: GovernanceReplica, *, log: GovernanceLog | None = None) -> None:
        """Store entries on `log` (None: each entry applies to `replica` directly)."""
        self.replica = replica
        self._log = log

    async def decided(self, record: DecisionRecord, counts: DecisionCounts | None = None) -> None:
        """Log a decision this replica made (having counted `counts`); returns once the stream holds it."""
        entry = self.replica.entry()
        entry.decision.record.CopyFrom(record)
        if counts is not None:
            entry.decision.counts.CopyFrom(counts)
            self.replica.counted_here(record.decision_id)
        if self._log is None:
            await self.replica.apply(0, entry)
            return
        # Stored, not applied: the answer does not wait for this replica's apply, and every read
        # waits for this replica to apply what the stream holds (`caught_up`).
        await self._log.store(log_subject(entry), entry, msg_id=record.decision_id)

    async def settle(self, settled: RunSettled) -> None:
        """A run's end: stored and applied here before this returns."""
        entry = self.replica.entry()
        entry.run_settled.CopyFrom(settled)
        await self.write(entry)

    async def switch(self, change: KillSwitchChange) -> dict[str, Any]:
        """Arm or disarm the kill switch everywhere; the switch's state here once applied."""
        entry = self.replica.entry()
        entry.kill_switch.CopyFrom(change)
        result: dict[str, Any] = await self.write(entry)
        return result

    async def reload(self, reload: PolicyReload) -> dict[str, Any]:
        """Reload the policies everywhere; what this replica reloaded (`GovernanceBadRequestError` if refused)."""
        entry = self.replica.entry()
        entry.reload.CopyFrom(reload)
        result: dict[str, Any] = await self.write(entry)
        return result

    async def write(self, entry: GovernanceLogEntry) -> Any:
        """Store `entry` and wait until this replica applied it; the apply's answer."""
        if self._log is None:
            return await self.replica.apply(0, entry)
        return await self._log.write(log_subject(entry), entry)

    async def caught_up(self) -> None:
        """Before a read: wait until this replica applied all the log held when this was called."""
        if self._log is not None:
            await self._log.caught_up()
