"""Replay: a run rebuilt from its steps, its tree, and `atmo.tape.replay` answering within one bus message."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus import RemoteError, subjects
from atmosphere.bus.runs import ANSWER_REWOUND_METADATA_KEY, RESUMED_METADATA_KEY
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.run.v1.run_pb2 import (
    Complete,
    InputMessage,
    Metadata,
    RunEvent,
    RunInput,
    TextDelta,
    ToolResult,
    ToolStart,
)
from atmosphere.contracts.tape.v1.tape_pb2 import ReplayRequest, ReplayResponse
from atmosphere.tape.handlers import TapeHandlers
from atmosphere.tape.recorder import Recorder
from atmosphere.tape.replay import reconstruct, reconstruct_tree
from atmosphere.tape.store import RunRow, Step, TapeStore

LIMIT = 64 * 1024


def event(seq: int, run_id: str, *, at: int = 0, parent: str = "", **kind: Any) -> RunEvent:
    ts = Timestamp()
    ts.FromMilliseconds(at or 1_000 + seq)
    return RunEvent(
        run_id=run_id, seq=seq, conversation_id="c", agent="echo", parent_run_id=parent, timestamp=ts, **kind
    )


def conversation(run_id: str, *, at: int = 1_000, parent: str = "", answer: str = "It is noon.") -> list[RunEvent]:
    messages = [InputMessage(role="system", content="Be brief."), InputMessage(role="user", content="Time?")]
    second_round = [InputMessage(role="user", content="Time?"), InputMessage(role="tool", content="12:00")]
    return [
        event(1, run_id, at=at, parent=parent, input=RunInput(messages=messages, model="m1")),
        event(2, run_id, at=at, parent=parent, text_delta=TextDelta(text="Checking. ")),
        event(3, run_id, at=at, parent=parent, tool_start=ToolStart(tool_name="clock", arguments_json='{"tz":"UTC"}')),
        event(4, run_id, at=at, parent=parent, tool_result=ToolResult(tool_name="clock", result="12:00")),
        event(5, run_id, at=at, parent=parent, input=RunInput(messages=second_round, model="m1")),
        event(6, run_id, at=at, parent=parent, text_delta=TextDelta(text=answer)),
        event(7, run_id, at=at, parent=parent, complete=Complete()),
    ]


@pytest.fixture
async def tape(store: TapeStore) -> AsyncIterator[tuple[FakeBus, TapeStore]]:
    bus = FakeBus(max_payload=LIMIT)
    async with bus.serve(TapeHandlers(store, max_payload=LIMIT).router()):
        yield bus, store


async def replay(bus: FakeBus, run_id: str) -> ReplayResponse:
    return await bus.request(subjects.tape("replay"), ReplayRequest(run_id=run_id), ReplayResponse)


def test_reconstruct_reads_the_first_input_the_own_text_and_the_tool_starts() -> None:
    run = RunRow("r", "", "", "", "COMPLETED", 1, 2, 6, "")
    steps = [
        Step("r", 1, "input", '{"messages": [{"role": "user", "content": "hi"}, {"content": 3}]}', 1),
        Step("r", 2, "text", '{"text": "Hel"}', 1),
        Step("r", 3, "tool-start", '{"toolName": "t", "argumentsJson": "{}"}', 1),
        Step("r", 4, "text", "not json", 1),
        Step("r", 5, "input", '{"messages": [{"role": "user", "content": "later"}]}', 1),
        Step("r", 6, "text", '{"text": "lo"}', 1),
        Step("r", 7, "tool-start", '{"toolName": "sub", "originRunId": "child"}', 1),
    ]
    rebuilt = reconstruct(run, steps)
    assert rebuilt.input == [("user", "hi"), ("user", "")]
    assert rebuilt.output == "Hello"
    assert [(t.name, t.arguments) for t in rebuilt.tools] == [("t", "{}")]


async def test_the_replay_of_a_tree_is_the_root_and_its_children_by_start(tape: tuple[FakeBus, TapeStore]) -> None:
    bus, store = tape
    recorder = Recorder(store)
    await recorder.record(conversation("root", at=1_000))
    await recorder.record(conversation("child-late", at=3_000, parent="root", answer="B"))
    await recorder.record(conversation("child-early", at=2_000, parent="root", answer="A"))
    await recorder.record(conversation("grandchild", at=2_500, parent="child-early"))
    answer = await replay(bus, "root")
    assert (answer.present, answer.run_count, answer.children_omitted) == (True, 3, 0)
    root = answer.root
    assert (root.run_id, root.status, root.model, root.started_at, root.ended_at) == (
        "root",
        "COMPLETED",
        "m1",
        1000,
        1000,
    )
    assert [(m.role, m.content) for m in root.input] == [("system", "Be brief."), ("user", "Time?")]
    assert root.output == "Checking. It is noon."
    assert [(t.name, t.arguments) for t in root.tools] == [("clock", '{"tz":"UTC"}')]
    assert [(c.run_id, c.parent_run_id, c.output) for c in answer.children] == [
        ("child-early", "root", "Checking. A"),
        ("child-late", "root", "Checking. B"),
    ]
    tree = await reconstruct_tree(store, "child-early")
    assert tree is not None
    assert [c.run.run_id for c in tree.children] == ["grandchild"]


async def test_a_resumed_answer_that_was_rewound_replays_as_the_client_ended_with_it(
    tape: tuple[FakeBus, TapeStore],
) -> None:
    bus, store = tape
    rewound = Metadata(key=ANSWER_REWOUND_METADATA_KEY, value_json=json.dumps({"discard": len("is the capit")}))
    await Recorder(store).record(
        [
            event(1, "r", text_delta=TextDelta(text="Paris is the capit")),
            event(2, "r", metadata=Metadata(key=RESUMED_METADATA_KEY, value_json="{}")),
            event(3, "r", metadata=rewound),  # the answer asked again came out differently
            event(4, "r", text_delta=TextDelta(text="has been the capital.")),
            event(5, "r", complete=Complete()),
        ]
    )
    assert (await replay(bus, "r")).root.output == "Paris has been the capital."


async def test_an_unknown_run_is_not_present_and_a_long_id_is_refused(tape: tuple[FakeBus, TapeStore]) -> None:
    bus, _ = tape
    absent = await replay(bus, "nope")
    assert (absent.run_id, absent.present, absent.HasField("root")) == ("nope", False, False)
    with pytest.raises(RemoteError) as refused:
        await replay(bus, "r" * 5000)
    assert refused.value.code == "tape.bad_request"


async def test_a_run_too_large_for_one_reply_is_shrunk_and_says_what_it_left_out(
    tape: tuple[FakeBus, TapeStore],
) -> None:
    bus, store = tape
    history = [InputMessage(role="system", content="sys")]
    history += [InputMessage(role="user", content=f"message {i} " + "x" * 40) for i in range(5000)]
    await Recorder(store).record(
        [
            event(1, "big", input=RunInput(messages=history)),
            event(2, "big", text_delta=TextDelta(text="é" * 100_000)),
            *[
                event(3 + i, "big", tool_start=ToolStart(tool_name=f"t{i}", arguments_json="[" + "1," * 500 + "1]"))
                for i in range(200)
            ],
        ]
    )
    answer = await replay(bus, "big")
    assert answer.ByteSize() <= LIMIT
    root = answer.root
    assert root.input_omitted > 0
    assert (root.input[0].content, root.input[-1].content[:12]) == ("sys", "message 4999")
    assert len(root.input) + root.input_omitted == 5001
    assert root.clipped
    assert "[truncated: the output is" in root.output
    assert len(root.tools) + root.tools_omitted == 200


async def test_children_that_no_longer_fit_are_counted_not_sent(tape: tuple[FakeBus, TapeStore]) -> None:
    bus, store = tape
    recorder = Recorder(store)
    await recorder.record(conversation("root"))
    answer = "z" * 8_000
    for i in range(40):
        await recorder.record(conversation(f"child-{i:02d}", at=2_000 + i, parent="root", answer=answer))
    reply = await replay(bus, "root")
    assert reply.ByteSize() <= LIMIT
    assert reply.run_count == 41
    assert 0 < len(reply.children) < 40
    assert len(reply.children) + reply.children_omitted == 40
    assert [c.run_id for c in reply.children] == [f"child-{i:02d}" for i in range(len(reply.children))]
