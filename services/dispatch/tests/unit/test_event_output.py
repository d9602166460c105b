"""The one event path: the terminal event once, its sequence before it, a breach written without re-entry."""

from __future__ import annotations

from atmosphere.contracts.common.v1.common_pb2 import Usage
from atmosphere.contracts.run.v1.run_pb2 import Complete, RunEvent, TextDelta
from atmosphere.dispatch.budget import BudgetMeter
from atmosphere.dispatch.event_output import EventOutput
from atmosphere.dispatch.resume import CapturedEvents
from atmosphere.sdk import AiBudget


class Recorder:
    def __init__(self) -> None:
        self.before: list[str] = []
        self.stopped = 0

    async def before_terminal(self, event: RunEvent) -> None:
        self.before.append(event.WhichOneof("kind") or "")

    def stop(self) -> None:
        self.stopped += 1


def output(recorder: Recorder, capture: CapturedEvents, meter: BudgetMeter | None = None) -> EventOutput:
    return EventOutput("r1", capture, before_terminal=recorder.before_terminal, stop=recorder.stop, meter=meter)


async def test_the_terminal_event_is_written_once_after_its_sequence() -> None:
    recorder, capture = Recorder(), CapturedEvents()
    out = output(recorder, capture)
    await out.emit(RunEvent(text_delta=TextDelta(text="hi")))
    await out.emit(RunEvent(complete=Complete()))
    await out.emit(RunEvent(complete=Complete()))
    assert [e.WhichOneof("kind") for e in capture.events] == ["text_delta", "complete"]
    assert recorder.before == ["complete"]
    assert (out.closed, out.dropped, out.succeeded, out.answer) == (True, 1, True, ["hi"])


async def test_a_budget_breach_ends_the_run_after_its_usage_without_emitting_again() -> None:
    recorder, capture = Recorder(), CapturedEvents()
    out = output(recorder, capture, BudgetMeter(AiBudget(max_total_tokens=10)))
    calls = 0
    emit = out.emit

    async def counted(event: RunEvent) -> None:
        nonlocal calls
        calls += 1
        await emit(event)

    out.emit = counted  # type: ignore[method-assign]
    await out.emit(RunEvent(usage=Usage(input_tokens=8, output_tokens=8)))
    assert calls == 1
    assert [e.WhichOneof("kind") for e in capture.events] == ["usage", "error"]
    assert capture.events[-1].error.code == "budget.exceeded"
    assert (out.breached, out.succeeded, recorder.stopped, recorder.before) == (True, False, 1, ["error"])
