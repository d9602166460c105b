"""`scripts/test_lanes.py`: `make test`'s lanes run at once, each one's output whole, any failure fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "scripts" / "test_lanes.py"


def _lanes(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(SCRIPT), "--logs", str(tmp_path / "logs"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_lanes_run_at_once_print_whole_and_report_each_duration(tmp_path: Path) -> None:
    # A rendezvous: each lane waits for the other's mark, so both end only if they ran at once.
    a, b = tmp_path / "a", tmp_path / "b"
    done = _lanes(
        tmp_path,
        "--live", "main",
        "main", f"echo live-line; touch {a}; until [ -e {b} ]; do sleep 0.05; done",
        "other", f"echo first; touch {b}; until [ -e {a} ]; do sleep 0.05; done; echo second",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert out.index("live-line") < out.index("== lane other")
    assert "first\nsecond\n" in out  # a captured lane's output, whole and in order
    assert (tmp_path / "logs" / "other.log").read_text() == "first\nsecond\n"
    assert not (tmp_path / "logs" / "main.log").exists()
    summary = out[out.index("== lanes ==") :]
    assert all(name in summary for name in ("main", "other", "all"))
    assert summary.count(" ok") == 2


def test_any_failing_lane_fails_the_run_and_is_named(tmp_path: Path) -> None:
    done = _lanes(tmp_path, "good", "true", "bad", "echo why; exit 3")
    assert done.returncode == 1
    assert "why" in done.stdout
    assert "FAILED (exit 3)" in done.stdout
    assert "good" in done.stdout


def test_malformed_lanes_are_refused(tmp_path: Path) -> None:
    assert _lanes(tmp_path, "only-a-name").returncode == 2
    assert "pairs" in _lanes(tmp_path, "only-a-name").stderr
    assert "must differ" in _lanes(tmp_path, "a", "true", "a", "true").stderr
    assert "is not a lane" in _lanes(tmp_path, "--live", "x", "a", "true").stderr


def test_each_lane_is_timed_when_it_ends_not_when_the_last_one_does(tmp_path: Path) -> None:
    # Listed first and slower: a lane waited on in turn would get the slow one's time too.
    done = _lanes(tmp_path, "slow", "sleep 0.5", "quick", "true")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = done.stdout[done.stdout.index("== lanes ==") :]
    quick = next(line for line in summary.splitlines() if line.strip().startswith("quick"))
    slow = next(line for line in summary.splitlines() if line.strip().startswith("slow"))
    assert _seconds(quick) < _seconds(slow)


def _seconds(line: str) -> float:
    minutes, seconds = line.split()[1].rstrip("s").split("m")
    return int(minutes) * 60 + float(seconds)
