"""The tape as several replicas on a real nats-server: every replica records every run.

Two tape replicas once split the runs between them (one shared consumer), so the same query
answered alternately "21 runs" and "3 runs". Now each replica records the whole `ATMO_EVENTS`
through a consumer of its own and answers a query only once it recorded everything stored
before it: asked again and again (the queue group picks either replica), the answer is one.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from atmosphere.bus import NatsBus, subjects
from atmosphere.contracts.run.v1.run_pb2 import Complete, RunEvent, TextDelta
from atmosphere.contracts.tape.v1.tape_pb2 import ListRunsRequest, ListRunsResponse
from atmosphere.testing import running_service

from .conftest import service_map

RUNS = 12


async def record_runs(bus: NatsBus, first: int, count: int) -> None:
    """`count` finished runs, published as dispatch publishes them."""
    for n in range(first, first + count):
        run_id = f"run{n}"
        events = [
            RunEvent(run_id=run_id, seq=1, conversation_id="tape1", agent="echo", text_delta=TextDelta(text="hi")),
            RunEvent(run_id=run_id, seq=2, conversation_id="tape1", agent="echo", complete=Complete()),
        ]
        for event in events:
            await bus.js_publish(subjects.run_events(run_id), event)


async def listed(bus: NatsBus) -> list[tuple[str, str, int]]:
    runs = await bus.request(subjects.tape("runs"), ListRunsRequest(tape_id="tape1"), ListRunsResponse)
    return sorted((r.run_id, r.status, r.step_count) for r in runs.runs)


def expected(count: int) -> list[tuple[str, str, int]]:
    return sorted((f"run{n}", "COMPLETED", 2) for n in range(count))


@pytest.mark.timeout(120)
async def test_tape_replicas_give_one_answer_before_and_after_a_replica_goes(
    nats_url: str, bus_namespace: str, nats_bus: NatsBus, tmp_path: Path
) -> None:
    def replica(volume: str) -> tuple[object, object]:
        return service_map(nats_url, bus_namespace, tmp_path / volume, ("tape",))["tape"]

    async with running_service("tape", *replica("b"), bus=nats_bus):
        replica_a = contextlib.AsyncExitStack()
        await replica_a.enter_async_context(running_service("tape", *replica("a"), bus=nats_bus))
        try:
            await record_runs(nats_bus, 0, RUNS)
            answers = [await listed(nats_bus) for _ in range(10)]
            assert answers == [expected(RUNS)] * 10
        finally:
            await replica_a.aclose()
        # One replica gone for good, a new one on an empty volume: it records the stream from
        # its start, and what is recorded meanwhile reaches both.
        async with running_service("tape", *replica("c"), bus=nats_bus):
            await record_runs(nats_bus, RUNS, 3)
            answers = [await listed(nats_bus) for _ in range(10)]
            assert answers == [expected(RUNS + 3)] * 10
