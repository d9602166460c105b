"""The bus against NATS in a container (testcontainers); skipped where no Docker engine runs."""

from __future__ import annotations

import pytest

from atmosphere.bus import JetStreamLayout, connect, subjects
from atmosphere.contracts.tape.v1.tape_pb2 import GetStepsRequest


@pytest.mark.docker
async def test_jetstream_on_a_containerized_nats(docker_nats_url: str) -> None:
    async with connect(docker_nats_url, name="docker-test") as bus:
        await bus.provision(JetStreamLayout())
        await bus.kv_put(subjects.AGENTS_BUCKET, "x", GetStepsRequest(run_id="1"))
        assert await bus.kv_get(subjects.AGENTS_BUCKET, "x", GetStepsRequest) == GetStepsRequest(run_id="1")
