"""The replication settings, as an operator sets them: environment variables."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from atmosphere.config import ServiceSettings, env_names


def test_replication_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATMOSPHERE_JETSTREAM__REPLICAS", "3")
    monkeypatch.setenv("ATMOSPHERE_JETSTREAM__STORAGE", "memory")
    monkeypatch.setenv("ATMOSPHERE_JETSTREAM__PLACEMENT_CLUSTER", "east")
    monkeypatch.setenv("ATMOSPHERE_JETSTREAM__PLACEMENT_TAGS", "ssd, zone-a,,")
    js = ServiceSettings().jetstream
    assert (js.replicas, js.storage, js.placement_cluster, js.placement_tags) == (
        3,
        "memory",
        "east",
        ("ssd", "zone-a"),
    )


def test_the_defaults_are_one_replica_on_file_anywhere() -> None:
    js = ServiceSettings().jetstream
    assert (js.replicas, js.storage, js.placement_cluster, js.placement_tags) == (1, "file", "", ())


@pytest.mark.parametrize(("name", "value"), [("REPLICAS", "0"), ("REPLICAS", "6"), ("STORAGE", "disk")])
def test_values_jetstream_cannot_take_are_refused(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(f"ATMOSPHERE_JETSTREAM__{name}", value)
    with pytest.raises(ValidationError):
        ServiceSettings()


def test_the_variables_are_listed_for_the_readme_and_the_manifests() -> None:
    assert {
        "ATMOSPHERE_JETSTREAM__REPLICAS",
        "ATMOSPHERE_JETSTREAM__STORAGE",
        "ATMOSPHERE_JETSTREAM__PLACEMENT_CLUSTER",
        "ATMOSPHERE_JETSTREAM__PLACEMENT_TAGS",
    } <= set(env_names(ServiceSettings))
