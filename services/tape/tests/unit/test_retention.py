"""Retention: the run and byte bounds hold after every batch, only ended runs go, the sweep abandons and expires."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.contracts.run.v1.run_pb2 import Complete, InputMessage, RunEvent, RunInput, TextDelta
from atmosphere.tape.recorder import Recorder
from atmosphere.tape.retention import Bounds, Retention, Totals
from atmosphere.tape.store import RunFilter, TapeStore
from atmosphere.tape.sweep import sweep


def event(seq: int, run_id: str, at: int, **kind: Any) -> RunEvent:
    ts = Timestamp()
    ts.FromMilliseconds(at)
    return RunEvent(run_id=run_id, seq=seq, conversation_id="c", agent="echo", timestamp=ts, **kind)


def short_run(i: int) -> list[RunEvent]:
    """Run `i`: an input, an answer whose size varies with `i`, the end; it starts at 1000 + `i` ms."""
    run_id = f"run-{i:05d}"
    question = RunInput(messages=[InputMessage(role="user", content=f"question {i}")])
    return [
        event(1, run_id, 1000 + i, input=question),
        event(2, run_id, 1000 + i, text_delta=TextDelta(text="a" * (10 + (i % 7) * 40))),
        event(3, run_id, 1000 + i, complete=Complete()),
    ]


async def held(store: TapeStore) -> Totals:
    """What the database really holds."""
    async with store.db.execute(
        "SELECT (SELECT COUNT(*) FROM tape_run),"
        " (SELECT COALESCE(SUM(LENGTH(CAST(payload AS BLOB))), 0) FROM tape_step)"
    ) as cursor:
        row = await cursor.fetchone()
    assert row is not None
    return Totals(int(row[0]), int(row[1]))


@pytest.mark.parametrize(
    "bounds", [Bounds(max_runs=500, max_bytes=60_000), Bounds(max_runs=500)], ids=["bytes-bind", "runs-bind"]
)
async def test_ten_thousand_short_runs_stay_within_the_run_and_byte_bounds(store: TapeStore, bounds: Bounds) -> None:
    retention = Retention(bounds)
    recorder = Recorder(store, retention=retention)
    # An old run that never ends: retention must keep it whatever the bounds say.
    await recorder.record([event(1, "still-open", 1, text_delta=TextDelta(text="..."))])
    events = [e for i in range(1, 10_001) for e in short_run(i)]
    peak = Totals()
    for start in range(0, len(events), 512):
        await recorder.record(events[start : start + 512])
        totals = await held(store)
        assert totals.runs <= bounds.max_runs
        assert totals.payload_bytes <= (bounds.max_bytes or totals.payload_bytes)
        assert retention.totals == totals  # the running totals do not drift from the database
        peak = Totals(max(peak.runs, totals.runs), max(peak.payload_bytes, totals.payload_bytes))
    if bounds.max_bytes:
        assert peak.payload_bytes > bounds.max_bytes * 0.9  # the byte bound is the one that bit
    else:
        assert peak.runs > bounds.max_runs * 0.98
    kept = [r.run_id for r in await store.runs(RunFilter(), limit=1000)]
    assert "still-open" in kept
    assert "run-10000" in kept
    newest_first = [r for r in kept if r != "still-open"]
    assert newest_first == sorted(newest_first, reverse=True)
    assert newest_first == [f"run-{i:05d}" for i in range(10_000, 10_000 - len(newest_first), -1)]  # the oldest went
    assert retention.evicted == 10_001 - len(kept)
    orphans = "SELECT COUNT(*) FROM tape_step WHERE run_id NOT IN (SELECT run_id FROM tape_run)"
    async with store.db.execute(orphans) as cursor:
        assert await cursor.fetchone() == (0,)  # evicted with their steps


async def test_the_totals_are_read_back_at_start(tmp_path: Path) -> None:
    async with TapeStore.open(tmp_path / "tape.db") as store:
        await Recorder(store).record([e for i in range(1, 21) for e in short_run(i)])
        before = await held(store)
    async with TapeStore.open(tmp_path / "tape.db") as store:
        retention = Retention(Bounds(max_runs=10))
        await retention.load(store.db)
        assert retention.totals == before
        await Recorder(store, retention=retention).record(short_run(21))
        assert (await held(store)).runs <= 10


async def test_open_runs_are_never_evicted(store: TapeStore) -> None:
    recorder = Recorder(store, retention=Retention(Bounds(max_runs=3)))
    await recorder.record([event(1, f"open-{i}", i, text_delta=TextDelta(text="x")) for i in range(6)])
    assert (await held(store)).runs == 6


async def test_the_sweep_abandons_idle_runs_and_the_next_event_reopens_them(store: TapeStore) -> None:
    now = [1_000_000]
    retention = Retention(Bounds(max_runs=100))
    recorder = Recorder(store, retention=retention, clock=lambda: now[0])
    await recorder.record([event(1, "quiet", 1, text_delta=TextDelta(text="a"))])
    await recorder.record([event(1, "busy", 1, text_delta=TextDelta(text="a"))])
    now[0] += 60_000
    await recorder.record([event(2, "busy", 2, text_delta=TextDelta(text="b"))])
    result = await sweep(store, retention, idle_timeout_ms=30_000, now_ms=now[0])
    quiet, busy = await store.run("quiet"), await store.run("busy")
    assert result.abandoned == 1
    assert quiet is not None
    assert busy is not None
    assert (quiet.status, quiet.ended_at, busy.status) == ("ABANDONED", now[0], "OPEN")
    await recorder.record(
        [event(2, "quiet", 2, text_delta=TextDelta(text="b")), event(3, "quiet", 3, complete=Complete())]
    )
    quiet = await store.run("quiet")
    assert quiet is not None
    assert (quiet.status, quiet.dropped_steps) == ("COMPLETED", 0)
    steps = await store.steps("quiet", from_seq=0, limit=10)
    assert [(s.seq, s.kind) for s in steps] == [(1, "text"), (3, "complete")]
    assert steps[0].payload == '{"text": "ab"}'


async def test_the_sweep_expires_ended_runs_past_max_age(store: TapeStore) -> None:
    retention = Retention(Bounds(max_runs=100, max_age_ms=10_000))
    recorder = Recorder(store, retention=retention, clock=lambda: 50_000)
    old_but_open = event(1, "open-old", 500, text_delta=TextDelta(text="x"))
    await recorder.record([*short_run(1_000), *short_run(45_000), old_but_open])
    result = await sweep(store, retention, idle_timeout_ms=10**9, now_ms=50_000)
    assert result.expired == 1
    assert {r.run_id for r in await store.runs(RunFilter(), limit=10)} == {"run-45000", "open-old"}
    assert retention.totals == await held(store)
