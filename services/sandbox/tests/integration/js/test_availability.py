"""`probe`: ACTIVE only when a worker really started V8 and evaluated `1+1`; otherwise why not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from atmosphere.sandbox.js.availability import EvalAvailability
from atmosphere.sandbox.js.pool import EvalPool, probe

from .conftest import SMALL, children, closed_without_leftovers

MISSING_MINI_RACER = """
raise ModuleNotFoundError("No module named 'py_mini_racer'", name="py_mini_racer")
"""


def test_labels() -> None:
    assert EvalAvailability(active=True, reason="mini-racer 0.14.1").label == "ACTIVE(mini-racer)"
    assert EvalAvailability(active=False, reason="disabled").label == "INACTIVE(disabled)"


async def test_disabled_starts_nothing() -> None:
    before = children()
    availability = await probe(SMALL.model_copy(update={"enabled": False}))
    assert availability.label == "INACTIVE(disabled)"
    assert children() == before


async def test_active_when_a_worker_evaluated_one_plus_one() -> None:
    before = children()
    availability = await probe(SMALL)
    assert availability.label == "ACTIVE(mini-racer)"
    assert availability.reason.startswith("mini-racer 0.14")
    assert "V8" in availability.reason
    assert children() == before  # the probe's own pool was closed


async def test_a_service_pool_probed_is_left_running() -> None:
    pool = EvalPool(SMALL)
    try:
        assert (await probe(SMALL, pool)).active
        assert len(pool.worker_pids()) == 1
    finally:
        await closed_without_leftovers(pool)


async def test_without_mini_racer_the_worker_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A `py_mini_racer` first on the worker's path that fails to import as a missing package does.
    (tmp_path / "py_mini_racer").mkdir()
    (tmp_path / "py_mini_racer" / "__init__.py").write_text(MISSING_MINI_RACER)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    pool = EvalPool(SMALL)
    assert await pool.start() == "INACTIVE(mini-racer not installed)"
    assert pool.worker_pids() == []
    outcome = await pool.evaluate("1+1")
    assert outcome.text == "Error: the JavaScript engine is not available (mini-racer not installed)"
    await closed_without_leftovers(pool)
    assert (await probe(SMALL)).label == "INACTIVE(mini-racer not installed)"


async def test_a_worker_that_cannot_be_run_is_inactive_with_the_reason(tmp_path: Path) -> None:
    availability = await probe(SMALL, python=str(tmp_path / "no-python"))
    assert not availability.active
    assert availability.label.startswith("INACTIVE(the JavaScript worker could not be started: ")


def test_the_service_side_never_imports_mini_racer() -> None:
    script = (
        "import sys, atmosphere.sandbox.js.pool, atmosphere.sandbox.js.tool, atmosphere.sandbox.js.availability;"
        "sys.exit(1 if 'py_mini_racer' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", script], check=False, timeout=30).returncode == 0
