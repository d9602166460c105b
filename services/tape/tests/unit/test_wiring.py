"""The tape's real `serve()` on a `FakeBus`: it records the events published and answers queries."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncIterator
from pathlib import Path

from atmosphere.bus import subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.service_pb2 import ServiceInfoRequest, ServiceInfoResponse
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.run.v1.run_pb2 import Complete, InputMessage, RunEvent, RunInput, TextDelta
from atmosphere.contracts.tape.v1.tape_pb2 import (
    GetStepsRequest,
    GetStepsResponse,
    ListRunsRequest,
    ListRunsResponse,
    ReplayRequest,
    ReplayResponse,
)
from atmosphere.tape.app import serve
from atmosphere.tape.settings import TapeOptions, TapeSettings
from atmosphere.testing import running_service


@contextlib.asynccontextmanager
async def tape(tmp_path: Path, **options: object) -> AsyncIterator[FakeBus]:
    """The tape served by its real `serve()` on a fresh `FakeBus`; stopped and awaited on exit."""
    bus = FakeBus()
    settings = TapeSettings(
        data_dir=tmp_path / "data",
        probe_host="127.0.0.1",
        probe_port=0,
        tape=TapeOptions(**options),  # type: ignore[arg-type]
    )
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


async def test_runs_carry_their_agents_runtime_endpoint_and_model_and_replay(tmp_path: Path) -> None:
    question = RunInput(messages=[InputMessage(role="user", content="Hi")], model="gpt-x")
    events = [
        RunEvent(run_id="r2", seq=1, agent="assistant", input=question),
        RunEvent(run_id="r2", seq=2, agent="assistant", text_delta=TextDelta(text="Hello")),
        RunEvent(run_id="r2", seq=3, agent="assistant", complete=Complete()),
    ]
    async with tape(tmp_path, redact=True, max_runs=50) as bus:
        descriptor = AgentDescriptor(name="assistant", path="/atmosphere/agent/assistant", runtime="built-in")
        await bus.kv_put(subjects.AGENTS_BUCKET, "assistant", descriptor)
        for event in events:
            await bus.publish(subjects.run_events(event.run_id), event)
        steps = await steps_of(bus, "r2", len(events))
        replay = await bus.request(subjects.tape("replay"), ReplayRequest(run_id="r2"), ReplayResponse)
        info = await bus.request(subjects.service_info("tape"), ServiceInfoRequest(), ServiceInfoResponse)
    run = steps.run
    assert (run.runtime, run.endpoint, run.model) == ("built-in", "/atmosphere/agent/assistant", "gpt-x")
    assert (replay.present, replay.root.output, replay.root.endpoint) == (True, "Hello", "/atmosphere/agent/assistant")
    block = json.loads(info.info_json)["tape"]
    assert block == {
        "enabled": True,
        "store": "sqlite",
        "path": str(tmp_path / "data" / "tape.db"),
        "maxRuns": 50,
        "maxAge": 0,
        "maxBytes": 0,
        "maxStepsPerRun": 5000,
        "maxTextChars": 262144,
        "idleTimeout": 1800,
        "redact": True,
    }
