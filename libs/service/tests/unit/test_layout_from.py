"""`layout_from`: the settings' replication reaches every stream and bucket a service provisions."""

from __future__ import annotations

from atmosphere.bus import Replication, Storage
from atmosphere.config import JetStreamSettings, ServiceSettings
from atmosphere.service._runtime import layout_from


def test_the_replication_settings_make_the_layouts_replication() -> None:
    settings = ServiceSettings(
        jetstream=JetStreamSettings(
            replicas=3, storage="memory", placement_cluster="east", placement_tags=("ssd",), events_max_age=60
        )
    )
    layout = layout_from(settings)
    assert layout.replication == Replication(
        replicas=3, storage=Storage.MEMORY, placement_cluster="east", placement_tags=("ssd",)
    )
    assert layout.events_max_age_seconds == 60
    specs = [*layout.streams(), *layout.buckets(), *layout.object_buckets()]
    assert {spec.replication.replicas for spec in specs} == {3}


def test_by_default_a_service_provisions_one_replica() -> None:
    assert layout_from(ServiceSettings()).replication == Replication()
