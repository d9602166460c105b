"""The AG-UI translation's edges: interrupt ids that must not be trusted, sub-agents, text framing."""

from __future__ import annotations

import pytest

# The AG-UI SDK is ingress's `ag-ui` extra: absent in the floors' lane (scripts/lowest_env.py).
pytest.importorskip("ag_ui.core")

from ag_ui.core import EventType

from atmosphere.contracts.run.v1.run_pb2 import Complete, RunEvent, TextDelta, ToolStart
from atmosphere.ingress.agui_events import AgUiTranslation, InterruptRef


def test_an_interrupt_id_round_trips() -> None:
    ref = InterruptRef("apr_0123456789ab", 17, "run:with:colons@x")
    assert InterruptRef.decode(ref.encode()) == ref


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "apr_0123456789ab",
        "apr_0123456789ab:x:run",
        "apr_0123456789ab:1:",
        "apr_0123456789ab:1:run.with.dots",
        "apr_0123456789ab:1:run>",
        "nope_0123:1:run",
        "apr_0123456789ab:9999999999999999:run",
        "apr_x y:1:run",
    ],
)
def test_a_malformed_interrupt_id_is_refused(raw: str) -> None:
    assert InterruptRef.decode(raw) is None


def test_text_is_framed_and_a_tool_call_closes_it() -> None:
    translation = AgUiTranslation(thread_id="t", run_id="r")
    out = translation.events(RunEvent(seq=2, text_delta=TextDelta(text="Hi ")))
    out += translation.events(RunEvent(seq=3, text_delta=TextDelta(text="there")))
    out += translation.events(RunEvent(seq=4, tool_start=ToolStart(tool_name="t", call_id="c1", arguments_json="")))
    assert [e.type for e in out] == [
        EventType.TEXT_MESSAGE_START,
        EventType.TEXT_MESSAGE_CONTENT,
        EventType.TEXT_MESSAGE_CONTENT,
        EventType.TEXT_MESSAGE_END,
        EventType.TOOL_CALL_START,
        EventType.TOOL_CALL_ARGS,
        EventType.TOOL_CALL_END,
    ]
    assert out[5].delta == "{}"


def test_a_sub_agents_text_carries_its_run_and_its_end_is_not_the_runs() -> None:
    translation = AgUiTranslation(thread_id="t", run_id="r")
    text = translation.events(RunEvent(seq=2, origin_run_id="sub-1", text_delta=TextDelta(text="x")))
    assert {e.subagent_run_id for e in text} == {"sub-1"}
    assert translation.events(RunEvent(seq=3, origin_run_id="sub-1", complete=Complete())) == []
    assert not translation.finished
