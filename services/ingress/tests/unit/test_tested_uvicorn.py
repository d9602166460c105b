"""Ingress's HTTP limits subclass uvicorn's private protocol: a server is built only on a tested uvicorn."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import uvicorn

from atmosphere.ingress.limits import (
    TESTED_UVICORN,
    HttpLimits,
    UntestedUvicornError,
    bounded_protocol,
    require_tested_uvicorn,
)

PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"


def test_the_installed_uvicorn_is_accepted() -> None:
    require_tested_uvicorn()
    assert bounded_protocol(HttpLimits()).limits == HttpLimits()


@pytest.mark.parametrize("version", ["0.55.0", "0.55.0rc1", "1.0.0", "0.49.9", "0.9", "unknown"])
def test_a_uvicorn_outside_the_tested_range_is_refused_when_the_server_is_built(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    monkeypatch.setattr(uvicorn, "__version__", version)
    with pytest.raises(UntestedUvicornError) as refused:
        bounded_protocol(HttpLimits())
    message = str(refused.value)
    assert f"uvicorn {version} is not a version ingress was tested on (>=0.50,<0.55)" in message
    assert "TESTED_UVICORN" in message


@pytest.mark.parametrize("version", ["0.50.0", "0.54.0", "0.54.9"])
def test_every_version_within_the_tested_range_is_accepted(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    monkeypatch.setattr(uvicorn, "__version__", version)
    require_tested_uvicorn()


def test_the_pin_in_pyproject_is_the_tested_range() -> None:
    """One range, two places: the dependency pin and the module's record must move together."""
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    (low_major, low_minor), (high_major, high_minor) = TESTED_UVICORN
    assert f"uvicorn[standard]>={low_major}.{low_minor},<{high_major}.{high_minor}" in dependencies
