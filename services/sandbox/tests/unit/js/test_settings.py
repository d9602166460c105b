"""`EvalSettings`: the original's key names, defaults, floors and the worker cap."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from atmosphere.sandbox.js.settings import MIB, EvalSettings


def test_defaults_are_the_originals() -> None:
    settings = EvalSettings()
    assert not settings.enabled
    assert settings.timeout_millis == 5000
    assert settings.max_output_chars == 8000
    assert settings.instruction_budget == 10_000_000
    assert settings.max_memory_bytes == 64 * MIB
    assert settings.workers == 1


def test_camel_case_keys_read_as_the_original_spells_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATMOSPHERE_AI_EVAL_ENABLED", "true")
    monkeypatch.setenv("ATMOSPHERE_AI_EVAL_TIMEOUTMILLIS", "1500")
    monkeypatch.setenv("ATMOSPHERE_AI_EVAL_MAXOUTPUTCHARS", "300")
    monkeypatch.setenv("ATMOSPHERE_AI_EVAL_MAXMEMORYBYTES", str(16 * MIB))
    monkeypatch.setenv("ATMOSPHERE_AI_EVAL_INSTRUCTIONBUDGET", "5000")
    monkeypatch.setenv("ATMOSPHERE_AI_EVAL_WORKERS", "2")
    settings = EvalSettings()
    assert settings.enabled
    assert (settings.timeout_millis, settings.max_output_chars) == (1500, 300)
    assert (settings.max_memory_bytes, settings.instruction_budget, settings.workers) == (16 * MIB, 5000, 2)


def test_snake_case_keys_read_too_and_unprefixed_ones_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATMOSPHERE_AI_EVAL_TIMEOUT_MILLIS", "700")
    monkeypatch.setenv("TIMEOUTMILLIS", "900")  # what an unprefixed alias would read
    monkeypatch.setenv("MAXOUTPUTCHARS", "900")
    settings = EvalSettings()
    assert settings.timeout_millis == 700
    assert settings.max_output_chars == 8000


@pytest.mark.parametrize("value", ["0", "-5"])
def test_non_positive_numbers_mean_the_default(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    for key in ("TIMEOUTMILLIS", "MAXOUTPUTCHARS", "MAXMEMORYBYTES", "INSTRUCTIONBUDGET", "WORKERS"):
        monkeypatch.setenv(f"ATMOSPHERE_AI_EVAL_{key}", value)
    settings = EvalSettings()
    assert (settings.timeout_millis, settings.max_output_chars, settings.instruction_budget) == (5000, 8000, 10**7)
    assert (settings.max_memory_bytes, settings.workers) == (64 * MIB, 1)


def test_numbers_under_a_floor_are_raised_to_it() -> None:
    settings = EvalSettings(timeoutMillis=10, instructionBudget=5, maxMemoryBytes=1024)
    assert settings.timeout_millis == 100
    assert settings.instruction_budget == 1000
    assert settings.max_memory_bytes == 8 * MIB
    assert EvalSettings(maxOutputChars=1).max_output_chars == 1


def test_workers_are_capped_at_two() -> None:
    assert EvalSettings(workers=16).workers == 2


def test_a_value_that_is_not_a_number_stops_the_start_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATMOSPHERE_AI_EVAL_TIMEOUTMILLIS", "soon")
    with pytest.raises(ValidationError, match="timeoutMillis"):
        EvalSettings()
