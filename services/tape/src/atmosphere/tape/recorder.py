"""Recording a batch of run events: load the runs it touches, apply each event, write, in one transaction.

A batch costs a few statements, not a few per event: one query loads the state of every run the
batch touches (with its open text step), each run's events are applied in seq order in memory
(`runstate.py`), then the new steps, the changed text steps, the runs and their gaps are written
with one `executemany` each, and retention evicts if a bound is passed, all in the batch's
transaction. The batch is acked only after the commit, so an event is never acked before it is
on disk; a failed commit redelivers the whole batch, and every event in it is then new again.

Recording never fails a batch over one event: an event whose payload cannot be made into JSON
is stored as `{"_unserializable": <kind>, "_error": <why>}` (and counted), one that breaks
anything else is logged and left out.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import aiosqlite

from atmosphere.bus.telemetry import bind_run
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.tape import metrics
from atmosphere.tape.agents import UNKNOWN, AgentDirectory, AgentFacts
from atmosphere.tape.redact import Redactor
from atmosphere.tape.retention import Bounds, Retention
from atmosphere.tape.runstate import INCOMPLETE, Limits, RunState, Segment
from atmosphere.tape.steps import (
    OWN_TEXT,
    Entry,
    FullText,
    Lane,
    Record,
    classify,
    dumps,
    event_ts,
    step_kind,
    terminal_status,
)
from atmosphere.tape.store import TapeStore

log = logging.getLogger("atmosphere.tape")

MAX_SEQ = (1 << 63) - 1
"""The largest seq SQLite can store; an event claiming a larger one is not recorded."""

_IN_CHUNK = 500
"""Run ids per `IN (...)` query (SQLite bounds the parameters of one statement)."""

_LOAD = (
    "SELECT r.run_id, r.status, r.started_at, r.ended_at, r.step_count, r.dropped_steps, r.truncated,"
    " r.last_event_seq, r.round_seq, r.terminal_seq, r.payload_bytes, r.touched_at, COALESCE(r.model, ''),"
    " r.owner, s.seq, s.kind, s.payload, s.ts"
    " FROM tape_run r LEFT JOIN tape_step s ON s.run_id = r.run_id AND s.seq = r.open_seq"
    " WHERE r.run_id IN ({marks})"
)

_INSERT_RUN = (
    "INSERT INTO tape_run (run_id, tape_id, session_id, agent, parent_run_id, runtime, endpoint, status,"
    " started_at, ended_at, step_count, dropped_steps, truncated, last_event_seq, open_seq, round_seq,"
    " terminal_seq, payload_bytes, touched_at, model, owner)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)

_UPDATE_RUN = (
    "UPDATE tape_run SET status = ?, started_at = ?, ended_at = ?, step_count = ?, dropped_steps = ?,"
    " truncated = ?, last_event_seq = ?, open_seq = ?, round_seq = ?, terminal_seq = ?, payload_bytes = ?,"
    " touched_at = ?, model = ?, owner = ? WHERE run_id = ?"
)


def _marks(count: int) -> str:
    return ", ".join("?" * count)


def _chunks(items: list[str]) -> Iterable[list[str]]:
    for start in range(0, len(items), _IN_CHUNK):
        yield items[start : start + _IN_CHUNK]


def _open_segment(seq: int | None, kind: str | None, payload: str | None, ts: int | None) -> Segment | None:
    """The open text step as stored, or None (none open, or not readable as text)."""
    if seq is None or kind is None or payload is None:
        return None
    try:
        data = json.loads(payload)
    except json.JSONDecodeError:
        return None
    lane = Lane.of(kind, data) if isinstance(data, dict) else None
    if lane is None:
        return None
    return Segment(seq, lane, str(data["text"]), int(ts or 0), bool(data.get("truncated")), len(payload))


def _loaded(row: Sequence[Any]) -> RunState:
    """The state of a run as `_LOAD` selected it."""
    state = RunState(
        run_id=str(row[0]),
        status=str(row[1]),
        started_at=int(row[2]),
        ended_at=None if row[3] is None else int(row[3]),
        step_count=int(row[4]),
        dropped_steps=int(row[5]),
        truncated=bool(row[6]),
        last_event_seq=int(row[7]),
        round_seq=int(row[8]),
        terminal_seq=int(row[9]),
        payload_bytes=int(row[10]),
        touched_at=int(row[11]),
        model=str(row[12]),
        owner=str(row[13]),
        is_new=False,
    )
    state.open = _open_segment(*row[14:18])
    return state


def _log_ends(by_run: dict[str, list[RunEvent]]) -> None:
    """One DEBUG line per run whose end this batch recorded, naming the run (and its agent)."""
    for run_id, run_events in by_run.items():
        ended = next((terminal_status(e) for e in run_events if terminal_status(e)), None)
        if ended:
            with bind_run(run_id, run_events[0].agent):
                log.debug("recorded run %s's end (%s, %d events in this batch)", run_id, ended, len(run_events))


def _new_run(event: RunEvent, facts: AgentFacts) -> RunState:
    return RunState(
        run_id=event.run_id,
        started_at=0,
        tape_id=event.conversation_id,
        session_id=event.session_id,
        agent=event.agent,
        parent_run_id=event.parent_run_id,
        runtime=facts.runtime,
        endpoint=facts.endpoint,
    )


@dataclass(slots=True)
class _Writes:
    """Every row a batch writes, gathered for one `executemany` per statement."""

    new_runs: list[tuple[object, ...]]
    run_updates: list[tuple[object, ...]]
    steps: list[tuple[object, ...]]
    step_updates: list[tuple[object, ...]]
    gap_resets: list[tuple[str]]
    gaps: list[tuple[str, int, int]]
    added_runs: int = 0
    added_bytes: int = 0


class Recorder:
    """Turns batches of run events into tape steps."""

    def __init__(
        self,
        store: TapeStore,
        *,
        limits: Limits | None = None,
        redactor: Redactor | None = None,
        retention: Retention | None = None,
        directory: AgentDirectory | None = None,
        clock: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        """Record into `store`; `clock` is the epoch-millisecond time of recording."""
        self.store = store
        self.limits = limits or Limits()
        self.redactor = redactor or Redactor(enabled=False)
        self.retention = retention or Retention(Bounds(max_runs=10_000))
        self.directory = directory or AgentDirectory(None)
        self.clock = clock
        self.unserializable = 0
        """Events stored with a stand-in payload since start."""

    async def record(self, events: Iterable[RunEvent]) -> None:
        """Record `events` (any runs, any order) in one transaction."""
        by_run: dict[str, list[RunEvent]] = {}
        for event in events:
            if event.run_id and 1 <= event.seq <= MAX_SEQ:
                by_run.setdefault(event.run_id, []).append(event)
            else:
                metrics.EVENTS_SKIPPED.labels("unrecordable").inc()
                log.warning("an event of run %r with seq %d is not recordable; skipped", event.run_id[:128], event.seq)
        if not by_run:
            return
        for run_events in by_run.values():
            run_events.sort(key=lambda e: e.seq)
        facts = {agent: await self.directory.facts(agent) for agent in {e[0].agent for e in by_run.values()}}
        async with self.store.transaction() as db:
            states = await self._load(db, by_run)
            now = self.clock()
            for run_id, run_events in by_run.items():
                state = states.setdefault(run_id, _new_run(run_events[0], facts.get(run_events[0].agent, UNKNOWN)))
                for event in run_events:
                    state.own(event.owner)
                    self._apply(state, event, now)
            writes = self._writes(states.values())
            await self._write(db, writes)
            totals = await self.retention.enforce(db, self.retention.totals.plus(writes.added_runs, writes.added_bytes))
        self.retention.totals = totals
        if log.isEnabledFor(logging.DEBUG):
            _log_ends(by_run)

    # -- loading -----------------------------------------------------------------------------

    async def _load(self, db: aiosqlite.Connection, by_run: dict[str, list[RunEvent]]) -> dict[str, RunState]:
        """The stored state of the runs in the batch, with what their events need besides."""
        states: dict[str, RunState] = {}
        for chunk in _chunks(list(by_run)):
            # One round trip to aiosqlite's thread per query: they are most of a small batch's cost.
            for row in await db.execute_fetchall(_LOAD.format(marks=_marks(len(chunk))), chunk):
                state = _loaded(row)
                states[state.run_id] = state
        for state in states.values():
            run_events = by_run[state.run_id]
            # Its gaps decide a completed run's status, and late events fill them.
            ends = any(terminal_status(e) for e in run_events)
            if run_events[0].seq <= state.last_event_seq or ends or state.status == INCOMPLETE:
                await self._load_gaps(db, state)
            if any(e.WhichOneof("kind") == "text_complete" and not e.origin_run_id for e in run_events):
                await self._load_round(db, state)
        return states

    @staticmethod
    async def _load_gaps(db: aiosqlite.Connection, state: RunState) -> None:
        async with db.execute(
            "SELECT from_seq, to_seq FROM tape_gap WHERE run_id = ? ORDER BY from_seq", (state.run_id,)
        ) as cursor:
            state.gaps = [(int(a), int(b)) for a, b in await cursor.fetchall()]
        state.gaps_loaded = True

    @staticmethod
    async def _load_round(db: aiosqlite.Connection, state: RunState) -> None:
        async with db.execute(
            "SELECT seq, payload FROM tape_step WHERE run_id = ? AND seq > ? AND kind = ?",
            (state.run_id, state.round_seq, OWN_TEXT),
        ) as cursor:
            for seq, payload in await cursor.fetchall():
                try:
                    text = json.loads(payload).get("text")
                except (json.JSONDecodeError, AttributeError):
                    continue
                if isinstance(text, str):
                    state.round_texts[int(seq)] = text

    # -- applying ----------------------------------------------------------------------------

    def _apply(self, state: RunState, event: RunEvent, now: int) -> None:
        try:
            entry, rendered = self._entry(event)
            state.apply(event.seq, event_ts(event) or now, entry, rendered=rendered, now=now, limits=self.limits)
        except Exception:
            # One event that cannot become a step must not hold back the batch (it would be
            # redelivered with it forever): it is logged and left out.
            metrics.EVENTS_SKIPPED.labels("failed").inc()
            log.exception("run %s: event %d cannot be recorded; skipped", event.run_id[:128], event.seq)

    def _entry(self, event: RunEvent) -> tuple[Entry, str]:
        """What `event` is to the tape, and a `Record`'s payload as stored."""
        try:
            entry = classify(event)
            rendered = dumps(self.redactor.payload(entry.payload)) if isinstance(entry, Record) else "{}"
        except Exception as exc:
            self.unserializable += 1
            kind = event.WhichOneof("kind") or "unknown"
            entry = Record(step_kind(event), terminal_status=terminal_status(event))
            rendered = dumps({"_unserializable": kind, "_error": f"{type(exc).__name__}: {exc}"[:1000]})
        if isinstance(entry, FullText) and self.redactor.enabled:
            # Compared with stored text, which is masked.
            entry = FullText(self.redactor.text(entry.text))
        return entry, rendered

    # -- writing -----------------------------------------------------------------------------

    def _writes(self, states: Iterable[RunState]) -> _Writes:
        writes = _Writes([], [], [], [], [], [])
        for state in states:
            if not state.changed:
                continue
            added = 0
            for seq, step in state.steps.items():
                writes.steps.append((state.run_id, seq, step.kind, step.payload, step.ts))
                added += len(step.payload)
            for segment in state.segments.values():
                payload = self._segment_payload(segment)
                if segment.stored_bytes:
                    writes.step_updates.append((payload, state.run_id, segment.seq))
                else:
                    writes.steps.append((state.run_id, segment.seq, segment.lane.kind, payload, segment.ts))
                added += len(payload) - segment.stored_bytes
            state.payload_bytes += added
            writes.added_bytes += added
            self._run_row(writes, state)
            if state.gaps_changed:
                if state.gaps_loaded:
                    writes.gap_resets.append((state.run_id,))
                writes.gaps += [(state.run_id, first, last) for first, last in state.gaps]
        return writes

    def _segment_payload(self, segment: Segment) -> str:
        payload = segment.lane.payload(self.redactor.text(segment.text), truncated=segment.truncated)
        return dumps(payload)

    @staticmethod
    def _run_row(writes: _Writes, state: RunState) -> None:
        open_seq = state.open.seq if state.open is not None else 0
        counters = (state.step_count, state.dropped_steps, int(state.truncated), state.last_event_seq, open_seq)
        later = (state.round_seq, state.terminal_seq, state.payload_bytes, state.touched_at, state.model, state.owner)
        if state.is_new:
            writes.added_runs += 1
            ids = (state.run_id, state.tape_id, state.session_id, state.agent, state.parent_run_id)
            writes.new_runs.append(
                (
                    *ids,
                    state.runtime,
                    state.endpoint,
                    state.recorded_status,
                    state.started_at,
                    state.ended_at,
                    *counters,
                    *later,
                )
            )
        else:
            writes.run_updates.append(
                (state.recorded_status, state.started_at, state.ended_at, *counters, *later, state.run_id)
            )

    @staticmethod
    async def _write(db: aiosqlite.Connection, writes: _Writes) -> None:
        statements: list[tuple[str, list[Any]]] = [
            (_INSERT_RUN, writes.new_runs),
            (_UPDATE_RUN, writes.run_updates),
            # OR IGNORE: a step is only ever inserted for a seq not seen before, so a conflict
            # would be a stored step the run's state did not know of; the stored one is kept.
            ("INSERT OR IGNORE INTO tape_step (run_id, seq, kind, payload, ts) VALUES (?, ?, ?, ?, ?)", writes.steps),
            ("UPDATE tape_step SET payload = ? WHERE run_id = ? AND seq = ?", writes.step_updates),
            ("DELETE FROM tape_gap WHERE run_id = ?", writes.gap_resets),
            ("INSERT OR REPLACE INTO tape_gap (run_id, from_seq, to_seq) VALUES (?, ?, ?)", writes.gaps),
        ]
        for statement, rows in statements:
            if rows:  # each call is a round trip: a batch of text deltas needs two
                await db.executemany(statement, rows)
