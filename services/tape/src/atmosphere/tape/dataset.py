"""Fine-tuning data from the tape: one chat example per completed run (Atmosphere's `TapeTrainingExtractor`).

A run becomes an example when it is COMPLETED, has an own `input` step with at least one
message, and its own text (`replay.reconstruct`), stripped, is not blank: the example is the
input's messages followed by `{"role": "assistant", "content": <that text>}`. Every other run is
counted by why it was left out (and noted, up to `MAX_NOTES`), never dropped silently.

`export_jsonl` writes one `{"messages": [{"role", "content"}...]}` line per example (chat JSONL,
as MLX-LM and Hugging Face chat fine-tuners read it). It opens the database read-only, so it
can run while the tape service records into it (WAL: it reads the last committed state), and
writes the file whole or not at all (a temporary file renamed over `out`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atmosphere.tape.replay import reconstruct
from atmosphere.tape.store import REPLAYED_STEPS, RunRow, Step, replayed_steps_parameters

MAX_NOTES = 50
"""Notes kept in a report, so the report itself stays small."""

Progress = Callable[[int, int], None]
"""Called with (runs processed, runs to process) as an export goes."""


class TapeFileError(Exception):
    """The file asked for is missing, unreadable, or not a tape database."""


@dataclass(slots=True)
class ExportReport:
    """What was emitted and what was left out, by reason."""

    runs_seen: int = 0
    emitted: int = 0
    skipped_not_terminal: int = 0
    """Runs not COMPLETED: open, failed, cancelled or abandoned (a partial turn is no example)."""
    skipped_no_input: int = 0
    skipped_no_output: int = 0
    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        """Keep `text` while fewer than `MAX_NOTES` are kept."""
        if len(self.notes) < MAX_NOTES:
            self.notes.append(text)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON names it (`runsSeen`, `emitted`, `skippedNotTerminal`, ...)."""
        return {
            "runsSeen": self.runs_seen,
            "emitted": self.emitted,
            "skippedNotTerminal": self.skipped_not_terminal,
            "skippedNoInput": self.skipped_no_input,
            "skippedNoOutput": self.skipped_no_output,
            "notes": list(self.notes),
        }


@dataclass(frozen=True, slots=True)
class Example:
    """One training example: the prompt's messages, then the assistant's answer."""

    messages: list[tuple[str, str]]

    def to_json(self) -> str:
        """The example's JSONL line (without the newline)."""
        messages = [{"role": role, "content": content} for role, content in self.messages]
        return json.dumps({"messages": messages}, ensure_ascii=False)


class TapeReader:
    """A tape database opened read-only (see `open`)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        """Read through `db`, a connection to a tape database."""
        self._db = db

    @classmethod
    @contextlib.contextmanager
    def open(cls, path: Path) -> Iterator[TapeReader]:
        """Open the tape database at `path` read-only; `TapeFileError` when it is none."""
        if not path.is_file():
            msg = f"no tape database at {path}"
            raise TapeFileError(msg)
        try:
            db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        except sqlite3.Error as exc:
            msg = f"cannot open {path}: {exc}"
            raise TapeFileError(msg) from None
        try:
            try:
                found = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'tape_run'").fetchone()
            except sqlite3.DatabaseError as exc:
                msg = f"{path} is not a tape database ({exc})"
                raise TapeFileError(msg) from None
            if found is None:
                msg = f"{path} is not a tape database (it has no tape_run table)"
                raise TapeFileError(msg)
            yield cls(db)
        finally:
            db.close()

    def runs(self, max_runs: int = 0) -> list[RunRow]:
        """The newest `max_runs` runs (0: all), newest first (the columns every tape schema has)."""
        rows = self._db.execute(
            "SELECT run_id, COALESCE(tape_id, ''), COALESCE(session_id, ''), COALESCE(agent, ''), status,"
            " started_at, ended_at, step_count, COALESCE(parent_run_id, '') FROM tape_run"
            " ORDER BY started_at DESC, run_id LIMIT ?",
            (max_runs if max_runs > 0 else -1,),
        ).fetchall()
        return [RunRow(*row) for row in rows]

    def replayed_steps(self, run_id: str) -> list[Step]:
        """The steps of `run_id` a replay reads, in order."""
        rows = self._db.execute(REPLAYED_STEPS, replayed_steps_parameters(run_id)).fetchall()
        return [Step(*row) for row in rows]


def _short(run_id: str) -> str:
    return run_id[:8]


def _example(run: RunRow, reader: TapeReader, report: ExportReport) -> Example | None:
    """`run` as an example, or None (counted and noted in `report`)."""
    if run.status != "COMPLETED":
        report.skipped_not_terminal += 1
        report.note(f"skip {_short(run.run_id)}: status={run.status}")
        return None
    replay = reconstruct(run, reader.replayed_steps(run.run_id))
    if not replay.input:
        report.skipped_no_input += 1
        report.note(f"skip {_short(run.run_id)}: no input step")
        return None
    answer = replay.output.strip()
    if not answer:
        report.skipped_no_output += 1
        report.note(f"skip {_short(run.run_id)}: no completion text")
        return None
    return Example([*replay.input, ("assistant", answer)])


def examples(
    reader: TapeReader, report: ExportReport, *, max_runs: int = 0, progress: Progress | None = None
) -> Iterator[Example]:
    """The examples of the newest `max_runs` runs (0: all), one at a time, counting into `report`."""
    runs = reader.runs(max_runs)
    if progress is not None:
        progress(0, len(runs))
    for done, run in enumerate(runs, start=1):
        report.runs_seen += 1
        example = _example(run, reader, report)
        if example is not None:
            report.emitted += 1
            yield example
        if progress is not None:
            progress(done, len(runs))


def extract(store: TapeReader, max_runs: int = 0) -> tuple[list[Example], ExportReport]:
    """Every example of the newest `max_runs` runs (0: all) and the report."""
    report = ExportReport()
    return list(examples(store, report, max_runs=max_runs)), report


def export_jsonl(db_path: Path, out: Path, *, max_runs: int = 0, progress: Progress | None = None) -> ExportReport:
    """Write the examples of the tape at `db_path` to `out` as chat JSONL; the report.

    `TapeFileError` when `db_path` is not a readable tape database (nothing is written then).
    """
    report = ExportReport()
    with TapeReader.open(db_path) as reader:
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(f".{out.name}.partial")
        try:
            with partial.open("w", encoding="utf-8") as file:
                for example in examples(reader, report, max_runs=max_runs, progress=progress):
                    file.write(example.to_json() + "\n")
            os.replace(partial, out)
        finally:
            partial.unlink(missing_ok=True)
    return report
