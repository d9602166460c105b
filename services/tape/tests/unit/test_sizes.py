"""The tape answers within one bus message: steps in pages, oversized payloads named by size."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus import RemoteError, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, ToolResult
from atmosphere.contracts.tape.v1.tape_pb2 import GetStepsRequest, GetStepsResponse, ListRunsRequest, ListRunsResponse
from atmosphere.tape.handlers import MAX_ID_CHARS, TapeHandlers
from atmosphere.tape.recorder import Recorder
from atmosphere.tape.store import TapeStore

LIMIT = 64 * 1024


def result_event(seq: int, text: str, run_id: str = "r1") -> RunEvent:
    """A tool result: a step of its own (text deltas in a row would coalesce into one)."""
    ts = Timestamp()
    ts.FromMilliseconds(1_000 + seq)
    return RunEvent(
        run_id=run_id, seq=seq, conversation_id="c", agent="echo", timestamp=ts, tool_result=ToolResult(result=text)
    )


def result_payload(text: str) -> dict[str, str]:
    return {"toolName": "", "callId": "", "result": text}


@pytest.fixture
async def tape(tmp_path: Path) -> AsyncIterator[tuple[FakeBus, TapeStore]]:
    bus = FakeBus(max_payload=LIMIT)
    async with (
        TapeStore.open(tmp_path / "tape.db") as store,
        bus.serve(TapeHandlers(store, max_payload=LIMIT).router()),
    ):
        yield bus, store


async def steps(bus: FakeBus, **request: object) -> GetStepsResponse:
    return await bus.request(subjects.tape("steps"), GetStepsRequest(**request), GetStepsResponse)  # type: ignore[arg-type]


async def test_steps_larger_than_one_reply_come_in_pages(tape: tuple[FakeBus, TapeStore]) -> None:
    bus, store = tape
    # JSON escapes make each payload larger than its event: a step's text of 3,000 "é" is 18 KB.
    await Recorder(store).record([result_event(seq, "é" * 3000) for seq in range(1, 21)])
    seen: list[int] = []
    from_seq = 0
    while True:
        page = await steps(bus, run_id="r1", from_seq=from_seq)
        assert page.ByteSize() <= LIMIT
        assert page.count == len(page.steps)
        assert page.run.step_count == 20
        seen += [s.seq for s in page.steps]
        if not page.next_from_seq:
            break
        assert page.next_from_seq == page.steps[-1].seq + 1
        from_seq = page.next_from_seq
    assert seen == list(range(1, 21))
    assert all(json.loads(s.payload_json) == result_payload("é" * 3000) for s in page.steps)


async def test_a_step_too_large_for_any_reply_is_named_by_its_size(tape: tuple[FakeBus, TapeStore]) -> None:
    bus, store = tape
    await Recorder(store).record([result_event(1, "ü" * 30_000), result_event(2, "ok")])
    page = await steps(bus, run_id="r1")
    first, second = page.steps
    assert first.payload_truncated
    size = len(json.dumps(result_payload("ü" * 30_000), sort_keys=True))
    assert json.loads(first.payload_json) == {"truncated": True, "bytes": size}
    assert not second.payload_truncated
    assert json.loads(second.payload_json) == result_payload("ok")


async def test_the_run_list_is_the_newest_runs_that_fit(tape: tuple[FakeBus, TapeStore]) -> None:
    bus, store = tape
    await Recorder(store).record([result_event(1, "x", run_id=f"{i:04d}-" + "r" * 900) for i in range(100)])
    listed = await bus.request(subjects.tape("runs"), ListRunsRequest(limit=1000), ListRunsResponse)
    assert listed.truncated
    assert 0 < len(listed.runs) < 100
    assert listed.ByteSize() <= LIMIT
    few = await bus.request(subjects.tape("runs"), ListRunsRequest(limit=3), ListRunsResponse)
    assert not few.truncated
    assert len(few.runs) == 3


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ({"run_id": "r1", "from_seq": 2**64 - 1}, "from_seq 18446744073709551615 is out of range"),
        ({"run_id": "r" * (MAX_ID_CHARS + 1)}, f"run_id is {MAX_ID_CHARS + 1} characters"),
    ],
    ids=["huge-seq", "long-run-id"],
)
async def test_queries_out_of_range_are_bad_requests(
    tape: tuple[FakeBus, TapeStore], request_: dict[str, object], message: str
) -> None:
    bus, _ = tape
    with pytest.raises(RemoteError) as refused:
        await steps(bus, **request_)
    assert refused.value.code == "tape.bad_request"
    assert message in refused.value.message
    with pytest.raises(RemoteError):
        await bus.request(subjects.tape("runs"), ListRunsRequest(tape_id="t" * 5000), ListRunsResponse)
