import asyncio
import json
from pathlib import Path

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus import ConsumerSpec, Envelope, Headers, JetStreamLayout, WorkItem, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.common_pb2 import Error
from atmosphere.contracts.run.v1.run_pb2 import Complete, Content, Metadata, RunEvent, TextDelta, ToolStart
from atmosphere.contracts.tape.v1.tape_pb2 import GetStepsRequest, GetStepsResponse, ListRunsRequest, ListRunsResponse
from atmosphere.tape import handlers as handlers_module
from atmosphere.tape.handlers import TapeHandlers, step_kind, step_payload
from atmosphere.tape.store import StepRecord, TapeStore


def event(seq: int, run_id: str = "r1", **kind: object) -> RunEvent:
    ts = Timestamp()
    ts.FromMilliseconds(1_000 + seq)
    return RunEvent(run_id=run_id, seq=seq, session_id="s", conversation_id="c", agent="echo", timestamp=ts, **kind)


def test_step_kinds_use_wire_names() -> None:
    assert step_kind(event(1, text_delta=TextDelta(text="x"))) == "text"
    assert step_kind(event(1, tool_start=ToolStart(tool_name="t"))) == "tool-start"
    assert step_kind(event(1, complete=Complete())) == "complete"


def test_payloads_are_json_and_never_binary() -> None:
    assert step_payload(event(1, metadata=Metadata(key="k", value_json='{"a": 1}'))) == {"key": "k", "value": {"a": 1}}
    content = step_payload(event(1, content=Content(content_type="image", mime_type="image/png", data=b"\x89PNG")))
    assert content["byteLength"] == 4
    assert len(str(content["sha256"])) == 64
    assert "data" not in content
    assert step_payload(event(1, tool_start=ToolStart(tool_name="t", arguments_json="{}"))) == {
        "toolName": "t",
        "callId": "",
        "argumentsJson": "{}",
    }


async def test_recording_is_idempotent_and_the_first_terminal_wins(tmp_path: Path) -> None:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    async with TapeStore.open(tmp_path / "tape.db") as store:
        handlers = TapeHandlers(store)
        events = [
            event(1, metadata=Metadata(key="X-Atmosphere-Run-Id", value_json='"r1"')),
            event(2, text_delta=TextDelta(text="hi")),
            event(3, complete=Complete()),
            event(2, text_delta=TextDelta(text="hi")),  # redelivered
            event(4, error=Error(message="late")),  # after the terminal
        ]
        for e in events:
            await bus.publish(subjects.run_events(e.run_id), e)
        consumer = ConsumerSpec(stream=subjects.EVENTS_STREAM, durable="tape", filter_subject=subjects.run_events_all())
        async with bus.consume_batches(consumer, RunEvent, handlers.record), bus.serve(handlers.router()):
            for _ in range(100):
                steps = await bus.request(subjects.tape("steps"), GetStepsRequest(run_id="r1"), GetStepsResponse)
                if steps.count == 4:
                    break
                await asyncio.sleep(0.01)
            runs = await bus.request(subjects.tape("runs"), ListRunsRequest(status="bogus"), ListRunsResponse)
            page = await bus.request(
                subjects.tape("steps"), GetStepsRequest(run_id="r1", from_seq=2, max=1), GetStepsResponse
            )
            missing = await bus.request(subjects.tape("steps"), GetStepsRequest(run_id="nope"), GetStepsResponse)
    assert [s.kind for s in steps.steps] == ["metadata", "text", "complete", "error"]
    assert steps.run.status == "COMPLETED"
    assert steps.run.ended_at == 1_003
    assert steps.run.step_count == 4
    assert json.loads(steps.steps[1].payload_json) == {"text": "hi"}
    assert [r.run_id for r in runs.runs] == ["r1"]
    assert [s.seq for s in page.steps] == [2]
    assert (missing.count, missing.HasField("run")) == (0, False)


async def test_an_event_that_cannot_become_a_step_does_not_hold_back_its_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = handlers_module.step_record

    def fussy(e: RunEvent) -> StepRecord:
        if e.seq == 2:
            raise ValueError("unrecordable")
        return real(e)

    monkeypatch.setattr(handlers_module, "step_record", fussy)
    async with TapeStore.open(tmp_path / "tape.db") as store:
        handlers = TapeHandlers(store)
        batch = [event(1, text_delta=TextDelta(text="a")), event(2, text_delta=TextDelta(text="b")), event(3)]
        items = [WorkItem(Envelope("atmo.run.r1.evt", e, Headers()), stream_seq=e.seq, delivered=1) for e in batch]
        await handlers.record(items)
        assert [s.seq for s in await store.steps("r1", from_seq=0, limit=10)] == [1, 3]
