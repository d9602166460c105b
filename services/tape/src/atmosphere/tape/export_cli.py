"""`python -m atmosphere.tape.export_cli OUT.jsonl [--db PATH] [--max-runs N]`: the tape as a dataset.

The program behind `atmosphere tape export`. It lives in the tape service because the tape owns
its database and its schema; the `atmosphere` command (a library, which never imports a service)
only launches it. It writes the tape's finished runs as chat-format JSON lines
(`atmosphere.tape.dataset.export_jsonl`), with a progress bar and a closing report on stderr.

Exit status: 0 written; 1 the database is missing or unreadable, or the file cannot be written;
2 bad flags, or `ATMOSPHERE_*` settings in the environment that do not validate; 130 Ctrl-C
(nothing is written then: `export_jsonl` writes the file whole or not at all).
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TextIO

from pydantic import ValidationError

from atmosphere.config import invalid_settings
from atmosphere.tape.dataset import ExportReport, Progress, TapeFileError, export_jsonl
from atmosphere.tape.settings import TapeSettings

EXIT_FAILED = 1
"""The tape database missing or unreadable, or the dataset file not writable."""
EXIT_USAGE = 2
"""Bad flags (argparse's own code), or settings in the environment that do not validate."""
EXIT_INTERRUPTED = 130
"""Ctrl-C during the export."""

DESCRIPTION = (
    'Write one {"messages": [...]} line per completed run that has a model input and an answer. '
    "Progress and the closing report go to stderr. Safe while the tape is recording."
)


class Exporter(Protocol):
    """`export_jsonl`'s signature: what `export` runs (the real one, or a stand-in in tests)."""

    def __call__(
        self, db_path: Path, out: Path, *, max_runs: int = 0, progress: Progress | None = None
    ) -> ExportReport:
        """Write the dataset of the tape at `db_path` to `out`; the report."""
        ...


def whole_number(value: str) -> int:
    """`value` as an int of 0 or more (an argparse type)."""
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        msg = f"{value!r} is not a whole number of 0 or more"
        raise argparse.ArgumentTypeError(msg)
    return number


def parser() -> argparse.ArgumentParser:
    """The program's flags (the same as `atmosphere tape export`'s)."""
    flags = argparse.ArgumentParser(prog="python -m atmosphere.tape.export_cli", description=DESCRIPTION)
    flags.add_argument("out", type=Path, metavar="OUT.jsonl", help="the file to write")
    flags.add_argument("--db", type=Path, help="the tape's SQLite file (default: the tape service's own)")
    flags.add_argument("--max-runs", type=whole_number, default=0, metavar="N", help="at most N runs (default: 0, all)")
    return flags


def main(
    argv: list[str] | None = None,
    *,
    exporter: Exporter = export_jsonl,
    read_settings: Callable[[], TapeSettings] = TapeSettings,
    err: TextIO | None = None,
) -> int:
    """Entry point: parse `argv` (default: the command line) and export; the exit status."""
    args = parser().parse_args(argv)
    return export(args.out, db=args.db, max_runs=args.max_runs, exporter=exporter, read_settings=read_settings, err=err)


def export(
    out: Path,
    *,
    db: Path | None,
    max_runs: int = 0,
    exporter: Exporter = export_jsonl,
    read_settings: Callable[[], TapeSettings] = TapeSettings,
    err: TextIO | None = None,
) -> int:
    """Export the tape at `db` (default: the tape service's, by its settings) to `out`; the exit status."""
    err = err or sys.stderr
    try:
        # The settings are read only without --db: a bad setting that does not matter stops nothing.
        db_path = db or read_settings().db_path
    except ValidationError as exc:
        # Never `str(exc)`: pydantic repeats every rejected input, a password or a token included.
        settings = read_settings if isinstance(read_settings, type) else TapeSettings
        problems = "".join(f"\n  {line}" for line in invalid_settings(exc, settings))
        print(f"error: invalid settings in the environment:{problems}", file=err)
        return EXIT_USAGE
    if not db_path.is_file():
        print(f"error: no tape database at {db_path} (pass --db, or set ATMOSPHERE_DATA_DIR)", file=err)
        return EXIT_FAILED
    bar = ProgressBar(err)
    try:
        report = exporter(db_path, out, max_runs=max_runs, progress=bar.update)
    except (TapeFileError, sqlite3.Error, OSError) as exc:
        bar.finish()
        print(f"error: the export failed: {exc}", file=err)
        return EXIT_FAILED
    except KeyboardInterrupt:
        bar.finish()
        print(f"interrupted: nothing was written to {out}", file=err)
        return EXIT_INTERRUPTED
    bar.finish()
    for line in report_lines(report, out):
        print(line, file=err)
    return 0


def report_lines(report: ExportReport, out: Path) -> list[str]:
    """The closing report, in words."""
    lines = [
        f"wrote {report.emitted} of {report.runs_seen} runs to {out}",
        f"skipped: {report.skipped_not_terminal} not completed, {report.skipped_no_input} without a model input, "
        f"{report.skipped_no_output} without an answer",
    ]
    return lines + [f"note: {note}" for note in report.notes]


class ProgressBar:
    """A plain-text bar on one line of `err`, redrawn in place (a carriage return) when it moves a step."""

    WIDTH = 30

    def __init__(self, err: TextIO) -> None:
        """Draw on `err`."""
        self._err = err
        self._drawn: tuple[int, int] | None = None

    def update(self, done: int, total: int) -> None:
        """`done` of `total` runs processed (what `export_jsonl` calls as it goes)."""
        filled = self.WIDTH if total <= 0 else min(self.WIDTH, self.WIDTH * done // total)
        step = (filled, done * 100 // total if total > 0 else 100)
        if step == self._drawn and done != total:
            return
        self._drawn = step
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        self._err.write(f"\r[{bar}] {done}/{total} runs")
        self._err.flush()

    def finish(self) -> None:
        """End the bar's line (if one was drawn)."""
        if self._drawn is not None:
            self._err.write("\n")
            self._err.flush()
            self._drawn = None


if __name__ == "__main__":
    sys.exit(main())
