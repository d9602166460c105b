"""The tape's real `serve()` on a `FakeBus`: it records the events published and answers queries."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from pathlib import Path

from atmosphere.bus import subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.run.v1.run_pb2 import Complete, RunEvent, TextDelta
from atmosphere.contracts.tape.v1.tape_pb2 import GetStepsRequest, GetStepsResponse, ListRunsRequest, ListRunsResponse
from atmosphere.tape.app import serve
from atmosphere.tape.settings import TapeSettings
from atmosphere.testing import running_service


@contextlib.asynccontextmanager
async def tape(tmp_path: Path) -> AsyncIterator[FakeBus]:
    """The tape served by its real `serve()` on a fresh `FakeBus`; stopped and awaited on exit."""
    bus = FakeBus()
    settings = TapeSettings(data_dir=tmp_path / "data", probe_host="127.0.0.1", probe_port=0)
    async with running_service("tape", functools.partial(serve, bus=bus), settings, bus=bus):
        yield bus


async def steps_of(bus: FakeBus, run_id: str, count: int) -> GetStepsResponse:
    """The run's steps once `count` of them are recorded (the recorder commits in the background)."""
    while True:
        steps = await bus.request(subjects.tape("steps"), GetStepsRequest(run_id=run_id), GetStepsResponse)
        if steps.count >= count:
            return steps
        await asyncio.sleep(0.01)


async def test_serve_records_published_run_events_and_answers_queries(tmp_path: Path) -> None:
    events = [
        RunEvent(run_id="r1", seq=1, conversation_id="c1", agent="echo", text_delta=TextDelta(text="hi")),
        RunEvent(run_id="r1", seq=2, conversation_id="c1", agent="echo", complete=Complete()),
    ]
    async with tape(tmp_path) as bus:
        for event in events:
            await bus.publish(subjects.run_events(event.run_id), event)
        steps = await steps_of(bus, "r1", len(events))
        runs = await bus.request(subjects.tape("runs"), ListRunsRequest(tape_id="c1"), ListRunsResponse)
    assert [(s.seq, s.kind) for s in steps.steps] == [(1, "text"), (2, "complete")]
    assert steps.run.status == "COMPLETED"
    assert [(r.run_id, r.agent, r.status, r.step_count) for r in runs.runs] == [("r1", "echo", "COMPLETED", 2)]
