"""`python -m atmosphere.tape.export_cli`: flags, progress, the report, failures, exit codes.

Most tests run `main` against a stand-in with `export_jsonl`'s signature; the rest run the
tape's real exporter on real tape databases written by the `Recorder`, one of them through
`python -m` exactly as `atmosphere tape export` launches it.
"""

from __future__ import annotations

import io
import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from atmosphere.contracts.run.v1.run_pb2 import Complete, InputMessage, Metadata, RunEvent, RunInput, TextDelta
from atmosphere.tape import export_cli
from atmosphere.tape.dataset import ExportReport
from atmosphere.tape.recorder import Recorder
from atmosphere.tape.store import TapeStore


def report() -> ExportReport:
    return ExportReport(3, 1, 1, 0, 1, ["run r2 has no answer"])


@dataclass
class StandIn:
    """Has `export_jsonl`'s signature; records its call and reports progress as it goes."""

    calls: list[tuple[Path, Path, int]] = field(default_factory=list)
    fails: BaseException | None = None

    def __call__(
        self, db_path: Path, out: Path, *, max_runs: int = 0, progress: Callable[[int, int], None] | None = None
    ) -> ExportReport:
        self.calls.append((db_path, out, max_runs))
        if self.fails is not None:
            raise self.fails
        for done in range(4):
            assert progress is not None
            progress(done, 3)
        out.write_text('{"messages": []}\n')
        return report()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "tape.db"
    sqlite3.connect(path).close()
    return path


def test_export_shows_progress_and_the_report_on_stderr(db: Path, tmp_path: Path) -> None:
    stand_in, err = StandIn(), io.StringIO()
    out = tmp_path / "dataset.jsonl"
    assert export_cli.main([str(out), "--db", str(db), "--max-runs", "7"], exporter=stand_in, err=err) == 0
    assert stand_in.calls == [(db, out, 7)]
    assert out.read_text() == '{"messages": []}\n'
    bar, *lines = err.getvalue().split("\n")
    assert bar.split("\r")[1:] == [
        "[------------------------------] 0/3 runs",
        "[##########--------------------] 1/3 runs",
        "[####################----------] 2/3 runs",
        "[##############################] 3/3 runs",
    ]
    assert lines == [
        f"wrote 1 of 3 runs to {out}",
        "skipped: 1 not completed, 0 without a model input, 1 without an answer",
        "note: run r2 has no answer",
        "",
    ]


def test_the_bar_is_redrawn_only_when_it_moves_a_step() -> None:
    err = io.StringIO()
    bar = export_cli.ProgressBar(err)
    for done in range(1001):
        bar.update(done, 1000)
    bar.finish()
    draws = err.getvalue().split("\r")[1:]
    assert len(draws) <= 101 + export_cli.ProgressBar.WIDTH  # once per percent or cell, not per run
    assert draws[-1] == "[##############################] 1000/1000 runs\n"


def test_the_default_database_is_the_tape_services_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ATMOSPHERE_DATA_DIR", str(tmp_path / "data"))
    stand_in, err = StandIn(), io.StringIO()
    assert export_cli.main([str(tmp_path / "out.jsonl")], exporter=stand_in, err=err) == 1
    assert err.getvalue() == (
        f"error: no tape database at {tmp_path / 'data' / 'tape.db'} (pass --db, or set ATMOSPHERE_DATA_DIR)\n"
    )
    (tmp_path / "data").mkdir()
    sqlite3.connect(tmp_path / "data" / "tape.db").close()
    assert export_cli.main([str(tmp_path / "out.jsonl")], exporter=stand_in, err=io.StringIO()) == 0
    assert stand_in.calls == [(tmp_path / "data" / "tape.db", tmp_path / "out.jsonl", 0)]


def test_settings_that_do_not_validate_are_a_usage_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ATMOSPHERE_TAPE__MAX_BATCH", "none")
    err = io.StringIO()
    assert export_cli.main([str(tmp_path / "out.jsonl")], exporter=StandIn(), err=err) == 2
    assert err.getvalue().startswith("error: invalid settings in the environment:\n")
    assert "ATMOSPHERE_TAPE__MAX_BATCH: must be a whole number" in err.getvalue()
    assert "none" not in err.getvalue()  # the value itself is never repeated


def test_invalid_settings_never_print_a_password(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ATMOSPHERE_NATS__PASSWORD", "hunter2-hunter2")
    err = io.StringIO()
    assert export_cli.main([str(tmp_path / "out.jsonl")], exporter=StandIn(), err=err) == 2
    assert "ATMOSPHERE_NATS__*: a password without a user" in err.getvalue()
    assert "hunter2" not in err.getvalue()


def test_with_db_given_the_settings_are_not_read(monkeypatch: pytest.MonkeyPatch, db: Path, tmp_path: Path) -> None:
    monkeypatch.setenv("ATMOSPHERE_TAPE__MAX_BATCH", "none")
    assert export_cli.main([str(tmp_path / "o.jsonl"), "--db", str(db)], exporter=StandIn(), err=io.StringIO()) == 0


def test_a_missing_database_is_a_clear_failure(tmp_path: Path) -> None:
    stand_in, err = StandIn(), io.StringIO()
    none = tmp_path / "none.db"
    assert export_cli.main([str(tmp_path / "out.jsonl"), "--db", str(none)], exporter=stand_in, err=err) == 1
    assert err.getvalue() == f"error: no tape database at {none} (pass --db, or set ATMOSPHERE_DATA_DIR)\n"
    assert stand_in.calls == []


@pytest.mark.parametrize(
    "failure",
    [sqlite3.DatabaseError("file is not a database"), PermissionError("file is not a database")],
    ids=["sqlite", "os"],
)
def test_a_database_the_export_cannot_read_is_a_clear_failure(db: Path, tmp_path: Path, failure: Exception) -> None:
    stand_in, err = StandIn(fails=failure), io.StringIO()
    assert export_cli.main([str(tmp_path / "out.jsonl"), "--db", str(db)], exporter=stand_in, err=err) == 1
    assert err.getvalue() == "error: the export failed: file is not a database\n"


def test_ctrl_c_says_nothing_was_written(db: Path, tmp_path: Path) -> None:
    stand_in, err = StandIn(fails=KeyboardInterrupt()), io.StringIO()
    out = tmp_path / "out.jsonl"
    assert export_cli.main([str(out), "--db", str(db)], exporter=stand_in, err=err) == 130
    assert err.getvalue() == f"interrupted: nothing was written to {out}\n"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "the following arguments are required: OUT.jsonl"),
        (["out.jsonl", "--max-runs", "-3"], "'-3' is not a whole number of 0 or more"),
        (["out.jsonl", "--max-runs", "all"], "'all' is not a whole number"),
        (["out.jsonl", "--colour"], "unrecognized arguments: --colour"),
    ],
)
def test_bad_flags_are_a_usage_error(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        export_cli.main(argv, exporter=StandIn())
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


# -- the real exporter -------------------------------------------------------------------------


async def record(db: Path, *runs: list[RunEvent]) -> None:
    async with TapeStore.open(db) as store:
        await Recorder(store).record([event for run in runs for event in run])


def tape_run(run_id: str, *, prompt: bool) -> list[RunEvent]:
    kinds: list[dict[str, Any]] = [{"metadata": Metadata(key="X-Atmosphere-Run-Id", value_json=json.dumps(run_id))}]
    if prompt:
        messages = [InputMessage(role="system", content="Be brief."), InputMessage(role="user", content="Hi")]
        kinds.append({"input": RunInput(messages=messages)})
    kinds += [{"text_delta": TextDelta(text="Hello")}, {"text_delta": TextDelta(text=" there.")}]
    kinds.append({"complete": Complete()})
    return [RunEvent(run_id=run_id, seq=n, agent="helper", **kind) for n, kind in enumerate(kinds, start=1)]


EXAMPLE = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello there."},
    ]
}


async def test_the_tapes_own_exporter_writes_the_dataset(tmp_path: Path) -> None:
    db, out = tmp_path / "data" / "tape.db", tmp_path / "sets" / "chat.jsonl"
    await record(db, tape_run("prompted", prompt=True), tape_run("bare", prompt=False))
    err = io.StringIO()
    assert export_cli.main([str(out), "--db", str(db)], err=err) == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == [EXAMPLE]
    assert "\r[##############################] 2/2 runs\n" in err.getvalue()
    assert f"wrote 1 of 2 runs to {out}" in err.getvalue()
    assert "skipped: 0 not completed, 1 without a model input, 0 without an answer" in err.getvalue()


async def test_python_m_runs_the_export_as_the_cli_launches_it(tmp_path: Path) -> None:
    db, out = tmp_path / "tape.db", tmp_path / "-chat.jsonl"
    await record(db, tape_run("prompted", prompt=True))
    argv = [sys.executable, "-m", "atmosphere.tape.export_cli", "--max-runs", "0", "--db", str(db), "--", str(out)]
    finished = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    assert finished.returncode == 0, finished.stderr
    assert [json.loads(line) for line in out.read_text().splitlines()] == [EXAMPLE]
    assert f"wrote 1 of 1 runs to {out}" in finished.stderr


def test_a_file_that_is_no_tape_is_a_clear_failure(tmp_path: Path) -> None:
    not_a_tape, out = tmp_path / "notes.txt", tmp_path / "out.jsonl"
    not_a_tape.write_text("not a database")
    err = io.StringIO()
    assert export_cli.main([str(out), "--db", str(not_a_tape)], err=err) == 1
    assert err.getvalue().startswith(f"error: the export failed: {not_a_tape} is not a tape database")
    assert not out.exists()
