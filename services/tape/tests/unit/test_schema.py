"""A tape.db made by the previous tape (issue 10's schema) is migrated in place and recorded into."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.contracts.run.v1.run_pb2 import Complete, RunEvent, TextDelta
from atmosphere.tape.recorder import Recorder
from atmosphere.tape.retention import Bounds, Retention
from atmosphere.tape.schema import RUN_COLUMNS, migrate
from atmosphere.tape.store import TapeStore

PREVIOUS_SCHEMA = """
CREATE TABLE tape_run (
    run_id TEXT PRIMARY KEY, tape_id TEXT, session_id TEXT, agent TEXT, status TEXT NOT NULL,
    started_at INTEGER NOT NULL, ended_at INTEGER, step_count INTEGER NOT NULL DEFAULT 0, parent_run_id TEXT
);
CREATE TABLE tape_step (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, payload TEXT NOT NULL, ts INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE INDEX idx_tape_run_status_started ON tape_run (status, started_at);
INSERT INTO tape_run VALUES ('done', 'c', 's', 'echo', 'COMPLETED', 1001, 1003, 3, '');
INSERT INTO tape_step VALUES ('done', 1, 'text', '{"text": "he"}', 1001);
INSERT INTO tape_step VALUES ('done', 2, 'text', '{"text": "llo"}', 1002);
INSERT INTO tape_step VALUES ('done', 3, 'complete', '{}', 1003);
INSERT INTO tape_run VALUES ('going', 'c', 's', 'echo', 'OPEN', 2001, NULL, 1, '');
INSERT INTO tape_step VALUES ('going', 1, 'text', '{"text": "so far"}', 2001);
"""


def event(seq: int, run_id: str, **kind: Any) -> RunEvent:
    ts = Timestamp()
    ts.FromMilliseconds(5_000 + seq)
    return RunEvent(run_id=run_id, seq=seq, conversation_id="c", agent="echo", timestamp=ts, **kind)


def previous_db(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.executescript(PREVIOUS_SCHEMA)


async def test_a_previous_database_gains_the_new_columns_filled_in_from_its_steps(tmp_path: Path) -> None:
    path = tmp_path / "tape.db"
    previous_db(path)
    async with TapeStore.open(path) as store:
        done, going = await store.run("done"), await store.run("going")
        filled_in = "SELECT last_event_seq, terminal_seq, payload_bytes FROM tape_run ORDER BY run_id"
        async with store.db.execute(filled_in) as cursor:
            filled = await cursor.fetchall()
        assert await migrate(store.db) == []  # a second open adds nothing
    assert done is not None
    assert going is not None
    assert (done.status, done.step_count, done.dropped_steps, done.truncated) == ("COMPLETED", 3, 0, False)
    assert [tuple(row) for row in filled] == [
        (3, 3, len('{"text": "he"}') + len('{"text": "llo"}') + len("{}")),
        (1, 0, len('{"text": "so far"}')),
    ]
    with sqlite3.connect(path) as db:
        columns = {row[1] for row in db.execute("PRAGMA table_info(tape_run)")}
    assert set(RUN_COLUMNS) <= columns


async def test_recording_goes_on_in_a_migrated_database(tmp_path: Path) -> None:
    path = tmp_path / "tape.db"
    previous_db(path)
    async with TapeStore.open(path) as store:
        retention = Retention(Bounds(max_runs=100))
        await retention.load(store.db)
        recorder = Recorder(store, retention=retention)
        await recorder.record(
            [
                event(1, "going", text_delta=TextDelta(text="so far")),  # redelivered: already stored
                event(2, "going", text_delta=TextDelta(text=" and on")),
                event(3, "going", complete=Complete()),
                event(4, "done", text_delta=TextDelta(text="after the end")),
            ]
        )
        going = [(s.seq, s.kind, s.payload) for s in await store.steps("going", from_seq=0, limit=10)]
        done = await store.run("done")
        assert retention.totals.runs == 2
    assert going[:2] == [(1, "text", '{"text": "so far"}'), (2, "text", '{"text": " and on"}')]
    assert going[2][:2] == (3, "complete")
    assert done is not None
    assert (done.status, done.dropped_steps) == ("COMPLETED", 1)
