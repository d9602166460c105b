"""The tape on a `FakeBus`: recording from `ATMO_EVENTS` in batches and answering queries."""

import json
from pathlib import Path
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus import ConsumerSpec, JetStreamLayout, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.common_pb2 import Error
from atmosphere.contracts.run.v1.run_pb2 import Complete, Metadata, RunEvent, TextDelta
from atmosphere.contracts.tape.v1.tape_pb2 import GetStepsRequest, GetStepsResponse, ListRunsRequest, ListRunsResponse
from atmosphere.tape.handlers import TapeHandlers
from atmosphere.tape.store import TapeStore
from atmosphere.testing import wait_until


def event(seq: int, run_id: str = "r1", **kind: Any) -> RunEvent:
    ts = Timestamp()
    ts.FromMilliseconds(1_000 + seq)
    return RunEvent(run_id=run_id, seq=seq, session_id="s", conversation_id="c", agent="echo", timestamp=ts, **kind)


async def test_recording_from_the_stream_is_idempotent_and_the_first_terminal_wins(tmp_path: Path) -> None:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    async with TapeStore.open(tmp_path / "tape.db") as store:
        handlers = TapeHandlers(store)
        events = [
            event(1, metadata=Metadata(key="X-Atmosphere-Run-Id", value_json='"r1"')),
            event(2, text_delta=TextDelta(text="hi")),
            event(3, text_delta=TextDelta(text=" there")),
            event(4, complete=Complete()),
            event(2, text_delta=TextDelta(text="hi")),  # redelivered
            event(5, error=Error(message="late")),  # after the terminal
        ]
        for e in events:
            await bus.publish(subjects.run_events(e.run_id), e)
        consumer = ConsumerSpec(stream=subjects.EVENTS_STREAM, durable="tape", filter_subject=subjects.run_events_all())
        async with bus.consume_batches(consumer, RunEvent, handlers.record), bus.serve(handlers.router()):

            async def dropped() -> bool:
                run = await store.run("r1")
                return run is not None and run.dropped_steps == 1

            await wait_until(dropped, what="the tape to record the six events")
            steps = await bus.request(subjects.tape("steps"), GetStepsRequest(run_id="r1"), GetStepsResponse)
            runs = await bus.request(subjects.tape("runs"), ListRunsRequest(status="bogus"), ListRunsResponse)
            page = await bus.request(
                subjects.tape("steps"), GetStepsRequest(run_id="r1", from_seq=2, max=1), GetStepsResponse
            )
            missing = await bus.request(subjects.tape("steps"), GetStepsRequest(run_id="nope"), GetStepsResponse)
    assert [(s.seq, s.kind) for s in steps.steps] == [(1, "metadata"), (2, "text"), (4, "complete")]
    assert (steps.run.status, steps.run.ended_at, steps.run.step_count, steps.run.dropped_steps) == (
        "COMPLETED",
        1_004,
        3,
        1,
    )
    assert json.loads(steps.steps[1].payload_json) == {"text": "hi there"}
    assert [(r.run_id, r.dropped_steps) for r in runs.runs] == [("r1", 1)]
    assert [s.seq for s in page.steps] == [2]
    assert (missing.count, missing.HasField("run")) == (0, False)
