"""The follower examples apply `ai.run.answer_rewound`: a resumed answer is never shown spliced.

A run resumed mid-answer asks the model round again; when the new answer differs, the marker
says to drop the last N characters before the new text follows. The examples are fed the events
of such a run directly (a real resume is the e2e suites' business).
"""

from __future__ import annotations

import json

import pytest

from atmosphere.contracts.dispatch.v1.dispatch_pb2 import RunResponse
from atmosphere.contracts.run.v1.run_pb2 import Complete, Metadata, RunEvent, TextDelta
from examples.followers.follow_runs import Answers, line_of
from examples.followers.grpc_follow import Progress

SPLICED = "The sky is greenlooks blue."
"""What a client that ignores the marker shows."""
ANSWER = "The sky looks blue."


def resumed_run(run_id: str = "r") -> list[RunEvent]:
    """seq 1, the first worker's text, the resume, the rewind (of "is green"), the new text, the end."""
    rewind = Metadata(key="ai.run.answer_rewound", value_json=json.dumps({"discard": len("is green")}))
    return [
        RunEvent(run_id=run_id, seq=1, metadata=Metadata(key="X-Atmosphere-Run-Id", value_json=json.dumps(run_id))),
        RunEvent(run_id=run_id, seq=3, text_delta=TextDelta(text="The sky ")),
        RunEvent(run_id=run_id, seq=4, text_delta=TextDelta(text="is green")),
        RunEvent(run_id=run_id, seq=5, metadata=Metadata(key="ai.run.resumed", value_json='{"fromSeq": 5}')),
        RunEvent(run_id=run_id, seq=6, metadata=rewind),
        RunEvent(run_id=run_id, seq=7, text_delta=TextDelta(text="looks blue.")),
        RunEvent(run_id=run_id, seq=8, complete=Complete()),
    ]


def test_the_nats_follower_ends_each_run_with_its_answer_rewinds_applied() -> None:
    answers = Answers()
    interleaved = [e for pair in zip(resumed_run("a"), resumed_run("b"), strict=True) for e in pair]
    lines = [line_of(event, answers) for event in interleaved]
    ends = [line for line in lines if line["kind"] == "complete"]
    assert [(line["run"], line["answer"]) for line in ends] == [("a", ANSWER), ("b", ANSWER)]
    assert all("answer" not in line for line in lines if line["kind"] != "complete")
    rewind = next(line for line in lines if line["kind"] == "metadata" and "rewound" in line["data"]["key"])
    assert json.loads(rewind["data"]["valueJson"]) == {"discard": 8}  # the event itself, as it was


def test_the_nats_follower_names_no_answer_for_a_run_it_did_not_see_start() -> None:
    answers = Answers()
    lines = [line_of(event, answers) for event in resumed_run()[2:]]
    assert "answer" not in lines[-1]


def test_the_grpc_follower_prints_the_answer_again_after_a_rewind(capsys: pytest.CaptureFixture[str]) -> None:
    progress = Progress()
    for event in resumed_run():
        progress.take(RunResponse(run_id=event.run_id, seq=event.seq, event=event))
    out, err = capsys.readouterr()
    assert progress.answer == ANSWER
    assert "the answer was rewound: 8 characters withdrawn" in err
    # Printed text cannot be taken back: the answer is printed again, and the last copy is it.
    assert out.splitlines()[-1] == ANSWER
    assert SPLICED not in out.replace("\n", "")


def test_the_grpc_follower_following_from_a_later_seq_says_what_to_drop(capsys: pytest.CaptureFixture[str]) -> None:
    progress = Progress("r", after_seq=3)
    for event in resumed_run()[2:]:
        progress.take(RunResponse(run_id=event.run_id, seq=event.seq, event=event))
    _out, err = capsys.readouterr()
    assert progress.answer is None
    assert "drop the last 8 characters printed" in err


@pytest.mark.parametrize("user", ["atmo-observer", "team.dev.atmo-observer", "weird user/ä"])
def test_the_follower_reads_its_inbox_where_the_permissions_put_it(user: str) -> None:
    # The example imports nothing of Atmosphere but the contracts, so it spells the rule itself.
    from atmosphere.bus.permissions import inbox_prefix
    from examples.followers.follow_runs import inbox_of

    assert inbox_of(user) == inbox_prefix(user)
