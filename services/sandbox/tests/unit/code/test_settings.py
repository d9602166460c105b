"""`CodeSettings`: the original's key names, its non-positive-means-default rule, and sizes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from atmosphere.sandbox.code import CodeSettings
from atmosphere.sandbox.code.settings import MIB, parse_size


def test_defaults_are_the_originals() -> None:
    settings = CodeSettings()
    assert (settings.enabled, settings.engine, settings.network) == (False, "auto", "none")
    assert settings.image == "mcr.microsoft.com/playwright:v1.60.0-noble"
    assert (settings.memory_bytes, settings.cpus, settings.pids_limit) == (512 * MIB, 1.0, 256)
    assert (settings.exec_timeout_seconds, settings.sandbox_ttl_seconds) == (60, 300)
    assert (settings.max_artifacts, settings.max_artifact_bytes) == (8, 8 * MIB)
    assert settings.cpu_limit_seconds == 61


def test_camel_case_and_snake_case_keys_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATMOSPHERE_AI_CODE_ENABLED", "true")
    monkeypatch.setenv("ATMOSPHERE_AI_CODE_PIDSLIMIT", "32")
    monkeypatch.setenv("ATMOSPHERE_AI_CODE_EXEC_TIMEOUT_SECONDS", "5")
    monkeypatch.setenv("ATMOSPHERE_AI_CODE_MAXOUTPUTBYTES", "4096")
    monkeypatch.setenv("ATMOSPHERE_AI_CODE_MEMORY", "128m")
    monkeypatch.setenv("ATMOSPHERE_AI_CODE_ENGINE", "bwrap")
    settings = CodeSettings()
    assert settings.enabled
    assert (settings.pids_limit, settings.exec_timeout_seconds, settings.max_output_bytes) == (32, 5, 4096)
    assert (settings.memory_bytes, settings.engine) == (128 * MIB, "bwrap")


def test_non_positive_numbers_fall_back_to_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATMOSPHERE_AI_CODE_PIDSLIMIT", "0")
    monkeypatch.setenv("ATMOSPHERE_AI_CODE_EXECTIMEOUTSECONDS", "-3")
    monkeypatch.setenv("ATMOSPHERE_AI_CODE_CPUS", "0")
    monkeypatch.setenv("ATMOSPHERE_AI_CODE_MEMORY", "0")
    monkeypatch.setenv("ATMOSPHERE_AI_CODE_CPUSECONDS", "-1")
    settings = CodeSettings()
    assert (settings.pids_limit, settings.exec_timeout_seconds, settings.cpus) == (256, 60, 1.0)
    assert (settings.memory_bytes, settings.cpu_seconds) == (512 * MIB, None)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("ATMOSPHERE_AI_CODE_PIDSLIMIT", "many"),
        ("ATMOSPHERE_AI_CODE_MEMORY", "lots"),
        ("ATMOSPHERE_AI_CODE_ENGINE", "firecracker"),
        ("ATMOSPHERE_AI_CODE_NETWORK", "host"),
    ],
)
def test_a_value_that_does_not_parse_stops_the_start(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError):
        CodeSettings()


@pytest.mark.parametrize(
    ("text", "size"), [("512m", 512 * MIB), ("64K", 65536), ("1g", 1 << 30), ("1048576", MIB), ("1.5m", 3 * MIB // 2)]
)
def test_sizes_take_binary_suffixes(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_the_cpu_backstop_follows_the_timeout_and_cpus() -> None:
    assert CodeSettings(exec_timeout_seconds=3, cpus=2).cpu_limit_seconds == 7
    assert CodeSettings(cpu_seconds=9.5).cpu_limit_seconds == 10
