"""Dataset export: one chat example per completed run with an input and an answer, read while the tape writes."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.contracts.common.v1.common_pb2 import Error
from atmosphere.contracts.run.v1.run_pb2 import Complete, InputMessage, Metadata, RunEvent, RunInput, TextDelta
from atmosphere.tape.dataset import MAX_NOTES, TapeFileError, TapeReader, export_jsonl, extract
from atmosphere.tape.recorder import Recorder
from atmosphere.tape.store import TapeStore


def event(seq: int, run_id: str, at: int, **kind: Any) -> RunEvent:
    ts = Timestamp()
    ts.FromMilliseconds(at)
    return RunEvent(run_id=run_id, seq=seq, conversation_id="c", agent="echo", timestamp=ts, **kind)


def run(
    run_id: str, at: int, *, question: str | None = "Hi?", answer: str = "Hello!", end: Any = None
) -> list[RunEvent]:
    events = []
    if question is not None:
        messages = [InputMessage(role="system", content="Be kind."), InputMessage(role="user", content=question)]
        events.append(event(1, run_id, at, input=RunInput(messages=messages)))
    else:  # no input step, but no seq missing either (a run with a gap is not complete)
        events.append(event(1, run_id, at, metadata=Metadata(key="X-Atmosphere-Run-Id", value_json=f'"{run_id}"')))
    events.append(event(2, run_id, at, text_delta=TextDelta(text=answer)))
    events.append(event(3, run_id, at, **({"complete": Complete()} if end is None else end)))
    return events


async def record_examples(store: TapeStore) -> None:
    await Recorder(store).record(
        [
            *run("aaaaaaaa-ok", 1_000, question="Café?", answer="  Oui, bien sûr.  "),
            *run("bbbbbbbb-failed", 2_000, end={"error": Error(code="provider.timeout", message="slow")}),
            *run("cccccccc-noinput", 3_000, question=None),
            *run("dddddddd-blank", 4_000, answer="   "),
            event(1, "eeeeeeee-open", 5_000, text_delta=TextDelta(text="still going")),
            *run("ffffffff-ok", 6_000, question="2+2?", answer="4"),
        ]
    )


async def test_only_completed_runs_with_an_input_and_an_answer_become_examples(
    tmp_path: Path, store: TapeStore
) -> None:
    await record_examples(store)
    seen: list[tuple[int, int]] = []
    out = tmp_path / "out" / "train.jsonl"
    report = export_jsonl(tmp_path / "tape.db", out, progress=lambda done, total: seen.append((done, total)))
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert lines == [
        {
            "messages": [
                {"role": "system", "content": "Be kind."},
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4"},
            ]
        },
        {
            "messages": [
                {"role": "system", "content": "Be kind."},
                {"role": "user", "content": "Café?"},
                {"role": "assistant", "content": "Oui, bien sûr."},
            ]
        },
    ]
    assert "Café" in out.read_text(encoding="utf-8")  # written as UTF-8, not escaped
    assert report.to_dict() == {
        "runsSeen": 6,
        "emitted": 2,
        "skippedNotTerminal": 2,
        "skippedNoInput": 1,
        "skippedNoOutput": 1,
        "notes": [
            "skip eeeeeeee: status=OPEN",
            "skip dddddddd: no completion text",
            "skip cccccccc: no input step",
            "skip bbbbbbbb: status=ERROR",
        ],
    }
    assert seen == [(i, 6) for i in range(7)]


async def test_max_runs_takes_the_newest_and_extract_returns_the_examples(tmp_path: Path, store: TapeStore) -> None:
    await record_examples(store)
    report = export_jsonl(tmp_path / "tape.db", tmp_path / "two.jsonl", max_runs=2)
    assert (report.runs_seen, report.emitted) == (2, 1)
    with TapeReader.open(tmp_path / "tape.db") as reader:
        examples, extracted = extract(reader)
    assert extracted.emitted == len(examples) == 2
    assert examples[0].messages[-1] == ("assistant", "4")


async def test_notes_are_bounded(tmp_path: Path, store: TapeStore) -> None:
    await Recorder(store).record(
        [event(1, f"run-{i:03d}", 1_000 + i, text_delta=TextDelta(text="x")) for i in range(80)]
    )
    report = export_jsonl(tmp_path / "tape.db", tmp_path / "none.jsonl")
    assert (report.skipped_not_terminal, len(report.notes)) == (80, MAX_NOTES)
    assert (tmp_path / "none.jsonl").read_text() == ""


async def test_export_reads_a_database_the_tape_is_writing(tmp_path: Path, store: TapeStore) -> None:
    recorder = Recorder(store)
    await recorder.record(run("first", 1_000))
    async with store.transaction() as db:  # a write in progress, not committed: the export does not see it
        await db.execute("UPDATE tape_run SET status = 'ERROR' WHERE run_id = 'first'")
        report = export_jsonl(tmp_path / "tape.db", tmp_path / "a.jsonl")
        await db.rollback()
    assert report.emitted == 1
    await recorder.record(run("second", 2_000))
    assert export_jsonl(tmp_path / "tape.db", tmp_path / "b.jsonl").emitted == 2


def test_a_missing_or_foreign_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TapeFileError, match="no tape database at"):
        export_jsonl(tmp_path / "missing.db", tmp_path / "out.jsonl")
    (tmp_path / "notes.txt").write_text("not sqlite at all " * 100)
    with pytest.raises(TapeFileError, match="is not a tape database"):
        export_jsonl(tmp_path / "notes.txt", tmp_path / "out.jsonl")
    with sqlite3.connect(tmp_path / "other.db") as db:
        db.execute("CREATE TABLE something (x)")
    with pytest.raises(TapeFileError, match="has no tape_run table"):
        export_jsonl(tmp_path / "other.db", tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()
