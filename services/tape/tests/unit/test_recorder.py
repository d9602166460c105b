"""The recorder: durable text coalescing, boundaries, terminals, redelivery and late events, limits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus.errors import RunCancelledError
from atmosphere.bus.runs import RESUMED_METADATA_KEY
from atmosphere.contracts.common.v1.common_pb2 import Error, Usage
from atmosphere.contracts.run.v1.run_pb2 import (
    Complete,
    InputMessage,
    Metadata,
    Progress,
    RunEvent,
    RunInput,
    TextComplete,
    TextDelta,
    ToolCallDelta,
    ToolResult,
    ToolStart,
)
from atmosphere.tape import recorder as recorder_module
from atmosphere.tape.recorder import Recorder
from atmosphere.tape.replay import reconstruct_run
from atmosphere.tape.runstate import Limits
from atmosphere.tape.steps import Entry
from atmosphere.tape.store import RunFilter, RunRow, TapeStore


def event(seq: int, run_id: str = "r1", **fields: Any) -> RunEvent:
    """Event `seq` of `run_id`, stamped 1000 + seq epoch ms; `fields` set its kind (and origin)."""
    ts = Timestamp()
    ts.FromMilliseconds(1_000 + seq)
    return RunEvent(run_id=run_id, seq=seq, session_id="s", conversation_id="c", agent="echo", timestamp=ts, **fields)


def text(seq: int, piece: str, run_id: str = "r1", **fields: Any) -> RunEvent:
    return event(seq, run_id, text_delta=TextDelta(text=piece), **fields)


async def steps_of(store: TapeStore, run_id: str = "r1") -> list[tuple[int, str, dict[str, Any]]]:
    return [(s.seq, s.kind, json.loads(s.payload)) for s in await store.steps(run_id, from_seq=0, limit=10_000)]


async def run_of(store: TapeStore, run_id: str = "r1") -> RunRow:
    run = await store.run(run_id)
    assert run is not None
    return run


# -- coalescing --------------------------------------------------------------------------------


async def test_consecutive_text_deltas_become_one_step_at_the_first_seq(store: TapeStore) -> None:
    recorder = Recorder(store)
    await recorder.record([text(1, "Hel"), text(2, "lo "), text(3, "world")])
    await recorder.record([text(4, "!")])  # a later batch goes on with the same step
    assert await steps_of(store) == [(1, "text", {"text": "Hello world!"})]
    run = await run_of(store)
    assert (run.step_count, run.status) == (1, "OPEN")


async def test_coalescing_survives_a_restart_and_a_redelivered_batch_is_recorded_once(tmp_path: Path) -> None:
    batch = [text(1, "a"), text(2, "b")]
    async with TapeStore.open(tmp_path / "tape.db") as store:
        await Recorder(store).record(batch)
    async with TapeStore.open(tmp_path / "tape.db") as store:
        recorder = Recorder(store)
        await recorder.record(batch)  # acked late: delivered again after the restart
        await recorder.record([text(3, "c")])
        assert await steps_of(store) == [(1, "text", {"text": "abc"})]
        assert (await run_of(store)).step_count == 1


async def test_a_semantic_boundary_closes_the_text_and_progress_does_not(store: TapeStore) -> None:
    await Recorder(store).record(
        [
            text(1, "Let me "),
            event(2, progress=Progress(message="thinking")),
            event(3, metadata=Metadata(key="k", value_json="1")),
            text(4, "check."),
            event(5, tool_start=ToolStart(tool_name="clock", call_id="c1", arguments_json='{"tz": "UTC"}')),
            event(6, tool_result=ToolResult(tool_name="clock", call_id="c1", result="12:00")),
            text(7, "It is noon."),
            event(8, complete=Complete(summary="done")),
        ]
    )
    assert [(seq, kind) for seq, kind, _ in await steps_of(store)] == [
        (1, "text"),
        (2, "progress"),
        (3, "metadata"),
        (5, "tool-start"),
        (6, "tool-result"),
        (7, "text"),
        (8, "complete"),
    ]
    steps = {seq: payload for seq, _, payload in await steps_of(store)}
    assert steps[1] == {"text": "Let me check."}
    assert steps[7] == {"text": "It is noon."}
    run = await run_of(store)
    assert (run.status, run.ended_at, run.step_count) == ("COMPLETED", 1_008, 7)


async def test_text_is_cut_into_steps_at_max_text_chars(store: TapeStore) -> None:
    recorder = Recorder(store, limits=Limits(max_text_chars=10))
    await recorder.record([text(i, piece) for i, piece in enumerate(["aaaa", "bbbb", "cccc", "dddd", "eeee"], 1)])
    await recorder.record([text(6, "x" * 100)])  # one delta over the cap: one step, never split
    assert await steps_of(store) == [
        (1, "text", {"text": "aaaabbbbcccc", "truncated": True}),
        (4, "text", {"text": "ddddeeeexxxxxxxxxx" + "x" * 90, "truncated": True}),
    ]


async def test_equal_pieces_in_a_row_are_each_part_of_the_answer(store: TapeStore) -> None:
    recorder = Recorder(store)
    await recorder.record([text(1, "ha "), text(2, "ha ")])
    for seq in (3, 4):  # and across batches, as the recorder sees a slow stream
        await recorder.record([text(seq, "ha ")])
    assert await steps_of(store) == [(1, "text", {"text": "ha ha ha ha "})]


@pytest.mark.parametrize(
    ("before", "full", "expected"),
    [
        (["Hel", "lo"], "Hello world", "Hello world"),  # only the suffix not yet recorded is added
        (["Hello"], "Hello", "Hello"),  # nothing new
        (["draft"], "final answer", "final answer"),  # the open text is replaced
        ([], "all at once", "all at once"),
    ],
    ids=["suffix", "same", "replaced", "no-deltas"],
)
async def test_text_complete_replaces_the_rounds_text_without_counting_twice(
    store: TapeStore, before: list[str], full: str, expected: str
) -> None:
    events = [text(i, piece) for i, piece in enumerate(before, 1)]
    events.append(event(len(before) + 1, text_complete=TextComplete(full_text=full)))
    events.append(text(len(before) + 2, " Next round."))
    await Recorder(store).record(events)
    replay = await reconstruct_run(store, "r1")
    assert replay is not None
    assert replay.output == expected + " Next round."


async def test_text_complete_after_a_boundary_adds_only_the_rest(store: TapeStore) -> None:
    recorder = Recorder(store)
    await recorder.record([text(1, "Checking. "), event(2, tool_start=ToolStart(tool_name="t"))])
    await recorder.record([text(3, "Done"), event(4, text_complete=TextComplete(full_text="Checking. Done."))])
    assert [(seq, p["text"]) for seq, kind, p in await steps_of(store) if kind == "text"] == [
        (1, "Checking. "),
        (3, "Done."),
    ]


async def test_a_sub_agents_text_is_kept_out_of_the_runs_own_text(store: TapeStore) -> None:
    origin = {"origin_run_id": "sub1", "origin_agent": "researcher"}
    await Recorder(store).record(
        [
            text(1, "Asking. "),
            text(2, "Found ", **origin),
            text(3, "it.", **origin),
            event(4, tool_start=ToolStart(tool_name="search"), **origin),
            event(5, complete=Complete(), **origin),  # never forwarded, but must not end the parent
            text(6, "Answer."),
        ]
    )
    steps = await steps_of(store)
    assert steps[0] == (1, "text", {"text": "Asking. "})
    assert steps[1] == (2, "subagent-text", {"text": "Found it.", "originRunId": "sub1", "originAgent": "researcher"})
    assert steps[2][1:] == ("tool-start", {"toolName": "search", "callId": "", "argumentsJson": "", **_origin()})
    assert steps[-1] == (6, "text", {"text": "Answer."})
    assert (await run_of(store)).status == "OPEN"
    replay = await reconstruct_run(store, "r1")
    assert replay is not None
    assert (replay.output, replay.tools) == ("Asking. Answer.", [])


def _origin() -> dict[str, str]:
    return {"originRunId": "sub1", "originAgent": "researcher"}


async def test_tool_argument_fragments_are_not_recorded(store: TapeStore) -> None:
    await Recorder(store).record(
        [
            text(1, "a"),
            event(2, tool_call_delta=ToolCallDelta(call_id="c", arguments_fragment='{"x"')),
            event(3, metadata=Metadata(key="ai.toolCall.delta.c", value_json='"{"')),
            text(4, "b"),
        ]
    )
    assert await steps_of(store) == [(1, "text", {"text": "ab"})]
    assert (await run_of(store)).step_count == 1


async def test_input_resumed_usage_and_the_run_model(store: TapeStore) -> None:
    messages = [InputMessage(role="system", content="Be brief."), InputMessage(role="user", content="Hi")]
    await Recorder(store).record(
        [
            event(1, metadata=Metadata(key=RESUMED_METADATA_KEY, value_json='{"attempt": 2}')),
            event(2, input=RunInput(messages=messages, model="gpt-test", omitted_messages=3)),
            event(3, usage=Usage(input_tokens=5, output_tokens=7, model="gpt-other")),
        ]
    )
    steps = await steps_of(store)
    assert steps[0] == (1, "resumed", {"value": {"attempt": 2}})
    assert steps[1] == (
        2,
        "input",
        {
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            "model": "gpt-test",
            "omittedMessages": 3,
        },
    )
    assert steps[2][1] == "usage"
    assert steps[2][2]["inputTokens"] == "5"
    assert (await run_of(store)).model == "gpt-test"


# -- terminals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("terminal", "status"),
    [
        ({"complete": Complete(summary="ok")}, "COMPLETED"),
        ({"error": Error(code="provider.timeout", message="slow")}, "ERROR"),
        ({"error": Error(code=RunCancelledError.code, message="cancelled by the client")}, "CANCELLED"),
    ],
    ids=["complete", "error", "cancel"],
)
async def test_the_first_terminal_sets_the_status_and_later_steps_are_dropped_and_counted(
    store: TapeStore, terminal: dict[str, Any], status: str
) -> None:
    recorder = Recorder(store)
    late = [text(3, "late"), event(4, error=Error(message="second terminal"))]
    await recorder.record([text(1, "a"), event(2, **terminal), *late])
    await recorder.record(late)  # redelivered: not counted again
    run = await run_of(store)
    assert (run.status, run.ended_at, run.step_count, run.dropped_steps) == (status, 1_002, 2, 2)
    assert [kind for _, kind, _ in await steps_of(store)] == ["text", "complete" if status == "COMPLETED" else "error"]


async def test_past_max_steps_per_run_the_run_is_truncated_but_its_terminal_is_kept(store: TapeStore) -> None:
    recorder = Recorder(store, limits=Limits(max_steps_per_run=5))
    await recorder.record([event(i, progress=Progress(message=f"p{i}")) for i in range(1, 11)])
    await recorder.record([text(11, "more"), event(12, complete=Complete())])
    run = await run_of(store)
    assert (run.step_count, run.truncated, run.dropped_steps, run.status) == (6, True, 6, "COMPLETED")
    assert [seq for seq, _, _ in await steps_of(store)] == [1, 2, 3, 4, 5, 12]


async def test_six_thousand_steps_in_one_run_stop_at_the_default_cap(store: TapeStore) -> None:
    recorder = Recorder(store)
    events = [event(i, tool_start=ToolStart(tool_name="t", call_id=str(i))) for i in range(1, 6001)]
    for start in range(0, len(events), 512):
        await recorder.record(events[start : start + 512])
    run = await run_of(store)
    assert (run.step_count, run.truncated, run.dropped_steps) == (5000, True, 1000)


# -- redelivery and late events ------------------------------------------------------------------


async def test_an_event_stored_late_fills_its_gap_at_its_own_seq(store: TapeStore) -> None:
    recorder = Recorder(store)
    await recorder.record([text(1, "a"), text(2, "b"), text(4, "d"), text(5, "e")])  # 3 was resent, stored later
    await recorder.record([text(3, "c")])
    await recorder.record([text(3, "c"), text(4, "d")])  # redelivered: ignored
    assert [(seq, p["text"]) for seq, _, p in await steps_of(store)] == [(1, "ab"), (3, "c"), (4, "de")]
    replay = await reconstruct_run(store, "r1")
    assert replay is not None
    assert replay.output == "abcde"
    await recorder.record([text(6, "f")])
    assert [(seq, p["text"]) for seq, _, p in await steps_of(store)][-1] == (4, "def")


async def test_a_run_that_completed_with_events_missing_is_incomplete_until_they_arrive(store: TapeStore) -> None:
    # Its stream lost seq 3 (a node died with it): the answer on the tape is not whole, so the run
    # is never listed as COMPLETED, until the event is stored after all (sent again late).
    recorder = Recorder(store)
    await recorder.record([text(1, "a"), text(2, "b"), text(4, "d"), event(5, complete=Complete())])
    assert (await run_of(store)).status == "INCOMPLETE"
    await recorder.record([text(6, "after the end")])  # a later batch must not forget the gap
    assert (await run_of(store)).status == "INCOMPLETE"
    await recorder.record([text(3, "c")])
    assert (await run_of(store)).status == "COMPLETED"
    replay = await reconstruct_run(store, "r1")
    assert replay is not None
    assert replay.output == "abcd"


async def test_events_out_of_order_in_one_batch_are_applied_by_seq(store: TapeStore) -> None:
    await Recorder(store).record([text(3, "c"), text(1, "a"), text(2, "b"), text(2, "b")])
    assert await steps_of(store) == [(1, "text", {"text": "abc"})]


# -- hostile input -------------------------------------------------------------------------------


async def test_unrecordable_events_are_skipped_without_failing_the_batch(store: TapeStore) -> None:
    await Recorder(store).record(
        [
            RunEvent(seq=1, text_delta=TextDelta(text="no run id")),
            text(0, "seq zero"),
            RunEvent(run_id="r1", seq=2**64 - 1, text_delta=TextDelta(text="beyond what SQLite stores")),
            text(1, "kept"),
        ]
    )
    far_future = event(2)
    far_future.timestamp.seconds = 2**62  # no valid timestamp, and more milliseconds than SQLite stores
    await Recorder(store, clock=lambda: 5_000).record([far_future])
    assert await steps_of(store) == [(1, "text", {"text": "kept"}), (2, "unknown", {})]
    assert (await store.steps("r1", from_seq=2, limit=1))[0].ts == 5_000
    assert [r.run_id for r in await store.runs(RunFilter(), limit=10)] == ["r1"]


async def test_unknown_kinds_and_malformed_metadata_are_recorded_as_they_are(store: TapeStore) -> None:
    from_the_future = RunEvent.FromString(event(1).SerializeToString() + b"\xf8\x06\x01")  # field 111 = 1
    deep = "[" * 100_000 + "]" * 100_000
    await Recorder(store).record(
        [
            from_the_future,
            event(2, metadata=Metadata(key="bad", value_json="{not json")),
            event(3, metadata=Metadata(key="deep", value_json=deep)),
        ]
    )
    steps = await steps_of(store)
    assert steps[0] == (1, "unknown", {})
    assert steps[1] == (2, "metadata", {"key": "bad", "value": "{not json"})
    assert steps[2][2]["key"] == "deep"


async def test_a_payload_that_cannot_be_made_json_is_stored_as_a_stand_in(
    store: TapeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = recorder_module.classify  # type: ignore[attr-defined]

    def fussy(e: RunEvent) -> Entry:
        if e.seq == 2:
            raise ValueError("no JSON for you")
        return real(e)

    monkeypatch.setattr(recorder_module, "classify", fussy)
    recorder = Recorder(store)
    await recorder.record([text(1, "a"), event(2, complete=Complete()), text(3, "b")])
    steps = await steps_of(store)
    assert steps[1] == (2, "complete", {"_unserializable": "complete", "_error": "ValueError: no JSON for you"})
    assert recorder.unserializable == 1
    assert (await run_of(store)).status == "COMPLETED"  # the stand-in still ends the run


async def test_ids_at_the_length_limit_and_an_input_of_thousands_of_messages(store: TapeStore) -> None:
    run_id = "r" * 1024
    messages = [InputMessage(role="user" if i % 2 else "assistant", content=f"m{i}") for i in range(5000)]
    await Recorder(store).record([event(1, run_id, input=RunInput(messages=messages)), text(2, "ok", run_id)])
    replay = await reconstruct_run(store, run_id)
    assert replay is not None
    assert len(replay.input) == 5000
    assert replay.output == "ok"
