"""Streamed answers checked as they stream: held until a check covers them, stopped before a match leaves."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator

import pytest

from atmosphere.bus import JetStreamLayout, MessageContext, Router, subjects
from atmosphere.bus.errors import NoRespondersError
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.governance.v1.governance_pb2 import (
    AdmitRequest,
    CheckOutputRequest,
    Decision,
    RunEndedAck,
    RunEndedReport,
)
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, TextDelta
from atmosphere.dispatch.governance_client import CHECK_WINDOW
from atmosphere.dispatch.output_guard import CHECK_EVERY, HOLD_BACK, Blocked, OutputGuard
from atmosphere.sdk import App, StreamingSession, agent, prompt
from atmosphere.testing import ScriptedModel, Turn, wait_until

from .conftest import Harness, Policy, kinds, request

EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")
ADDRESS = "jane.doe@example.com"


def _delta(text: str) -> RunEvent:
    return RunEvent(text_delta=TextDelta(text=text))


class PiiGovernance:
    """Stands in for governance with a PII policy on answers; records what it was asked."""

    def __init__(self, *, judges: bool = True) -> None:
        self.judges = judges
        self.checks: list[CheckOutputRequest] = []
        self.ended: list[RunEndedReport] = []

    def router(self) -> Router:
        router = Router()

        async def admit(_request: AdmitRequest, _ctx: MessageContext) -> Decision:
            return Decision(allowed=True, policy="pii", check_output=self.judges)

        async def check_output(request: CheckOutputRequest, _ctx: MessageContext) -> Decision:
            self.checks.append(request)
            if EMAIL.search(request.response):
                return Decision(allowed=False, policy="pii", reason="response contains PII of kinds: [email]")
            return Decision(allowed=True, policy="pii")

        async def run_ended(request: RunEndedReport, _ctx: MessageContext) -> RunEndedAck:
            self.ended.append(request)
            return RunEndedAck(tenant="__default__", priced=True)

        router.add(subjects.governance("admit"), AdmitRequest, admit)
        router.add(subjects.governance("check_output"), CheckOutputRequest, check_output)
        router.add(subjects.governance("run_ended"), RunEndedReport, run_ended)
        return router


async def _judge_email(answer: str, _length: int, _final: bool) -> Decision:
    if EMAIL.search(answer):
        return Decision(allowed=False, policy="pii", reason="response contains PII of kinds: [email]")
    return Decision(allowed=True)


def _released(events: list[RunEvent]) -> str:
    return "".join(e.text_delta.text for e in events)


@pytest.mark.parametrize("offset", [0, 37, 120, 150, 180, 199, 230, 400])
@pytest.mark.parametrize("piece", [1, 3, 7, 50])
async def test_no_part_of_an_email_is_released_wherever_it_falls(offset: int, piece: int) -> None:
    text = ("lorem ipsum " * 60)[:offset] + " " + ADDRESS + " and more text " * 40
    guard = OutputGuard(_judge_email, run_id="r")
    released: list[RunEvent] = []

    async def stream() -> None:
        for start in range(0, len(text), piece):
            released.extend(await guard.text(_delta(text[start : start + piece])))
        released.extend(await guard.before(final=True))

    with pytest.raises(Blocked) as blocked:
        await stream()
    out = _released(released)
    assert blocked.value.reason == "Response blocked: response contains PII of kinds: [email]"
    assert "@" not in out
    assert "jane" not in out
    assert text.startswith(out)  # what went out is a prefix of the answer, in order


async def test_text_is_released_at_whitespace_behind_a_hold_back_and_whole_at_the_end() -> None:
    guard = OutputGuard(_judge_email, run_id="r")
    words = [f"w{i:03d} " for i in range(200)]
    released: list[RunEvent] = []
    for word in words:
        released += await guard.text(_delta(word))
        held = guard.held_chars
        assert held < CHECK_EVERY + HOLD_BACK + len(word)  # never more than one interval plus the hold-back
        assert _released(released).endswith(" ") or not released  # never a word cut in two
    released += await guard.before(final=True)
    assert _released(released) == "".join(words)
    assert guard.checks == len("".join(words)) // CHECK_EVERY + 1


async def test_a_rounds_whole_text_releases_what_was_held_before_it() -> None:
    # A round's `text_complete` after its deltas: the held end of the answer goes out ahead of it.
    guard = OutputGuard(_judge_email, run_id="r")
    words = "".join(f"w{i:03d} " for i in range(100))
    released: list[RunEvent] = []
    for start in range(0, len(words), 5):
        released += await guard.text(_delta(words[start : start + 5]))
    assert guard.held_chars > 0
    released += await guard.whole_text(words)
    assert _released(released) == words
    assert guard.held_chars == 0


async def test_a_long_unbroken_token_is_released_after_its_check() -> None:
    guard = OutputGuard(_judge_email, run_id="r")
    blob = "A" * 3000
    released: list[RunEvent] = []
    for start in range(0, len(blob), 10):
        released += await guard.text(_delta(blob[start : start + 10]))
    assert len(_released(released)) > 0  # base64-like output still streams, checked
    assert guard.held_chars <= 4 * CHECK_EVERY + CHECK_EVERY


async def test_a_check_governance_does_not_answer_stops_the_answer() -> None:
    async def silent(_answer: str, _length: int, _final: bool) -> Decision:
        raise NoRespondersError("atmo.gov.check_output")

    guard = OutputGuard(silent, run_id="r")

    async def stream() -> None:
        for _ in range(CHECK_EVERY):
            await guard.text(_delta("x "))

    with pytest.raises(Blocked, match="governance is unavailable"):
        await stream()


@agent(name="leaky")
class Leaky:
    """Streams an answer that contains an email after a harmless start, a few characters at a time."""

    @prompt
    async def on_prompt(self, message: str, session: StreamingSession) -> None:
        text = "Here is what I found about your account. " * 6 + f"Write to {ADDRESS} for help. " + "More. " * 50
        for start in range(0, len(text), 4):
            await session.send(text[start : start + 4])


@agent(name="clean")
class Clean:
    @prompt
    async def on_prompt(self, message: str, session: StreamingSession) -> None:
        for _ in range(120):
            await session.send("fine ")


APP = App([Leaky, Clean])


@pytest.fixture
async def bare(fake_provider: ScriptedModel) -> AsyncIterator[Harness]:
    """A harness whose governance each test brings (the shared one never asks for answer checks)."""
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    async with contextlib.AsyncExitStack() as stack:
        yield Harness(bus=bus, provider=fake_provider, policy=Policy(), tool_calls=[], stack=stack)


async def _with(harness: Harness, governance: PiiGovernance) -> None:
    await harness.stack.enter_async_context(harness.bus.serve(governance.router()))


# 0: each released piece its own event; 30 s: every piece after the first joined (`CoalescedEvents`).
COALESCING = pytest.mark.parametrize("window", [0, 30.0], ids=["uncut", "coalesced"])


@COALESCING
async def test_a_run_is_stopped_before_any_frame_carries_the_email(bare: Harness, window: float) -> None:
    harness = bare
    governance = PiiGovernance()
    await _with(harness, governance)
    await harness.executor(APP, text_delta_window=window).execute(request("leaky"))
    events = harness.events()
    text = "".join(e.text_delta.text for e in events if e.WhichOneof("kind") == "text_delta")
    if window:  # the first release at once, the others joined and sent before the error
        assert kinds(events) == ["text_delta", "text_delta", "error"]
    assert "@" not in text
    assert "jane" not in text
    assert text.startswith("Here is what I found")
    assert kinds(events)[-1] == "error"
    error = events[-1].error
    assert error.code == "governance.response_blocked"
    assert error.message == "Response blocked: response contains PII of kinds: [email]"
    assert kinds(events).count("error") == 1
    assert "complete" not in kinds(events)
    # Nothing after the stop: the error is the last event, and the run's end was still reported.
    assert [r.run_id for r in governance.ended] == ["r1"]
    assert not governance.ended[0].succeeded


@COALESCING
async def test_a_clean_answer_streams_whole_with_a_final_check(bare: Harness, window: float) -> None:
    harness = bare
    governance = PiiGovernance()
    await _with(harness, governance)
    await harness.executor(APP, text_delta_window=window).execute(request("clean"))
    events = harness.events()
    assert "".join(e.text_delta.text for e in events if e.WhichOneof("kind") == "text_delta") == "fine " * 120
    assert kinds(events)[-1] == "complete"
    assert governance.checks[-1].final
    assert governance.checks[-1].response == "fine " * 120
    assert all(not c.final for c in governance.checks[:-1])
    assert governance.ended[0].succeeded
    assert governance.ended[0].response_chars == len("fine " * 120)


async def test_no_check_is_asked_when_no_policy_judges_answers(bare: Harness) -> None:
    harness = bare
    governance = PiiGovernance(judges=False)
    await _with(harness, governance)
    await harness.executor(APP).execute(request("leaky"))
    assert governance.checks == []
    assert kinds(harness.events())[-1] == "complete"


async def test_a_model_answer_is_stopped_and_its_usage_reported(bare: Harness) -> None:
    harness = bare
    governance = PiiGovernance()
    await _with(harness, governance)

    @agent(name="model")
    class Model:
        pass

    harness.provider.script(Turn.text("Sure. " * 40 + f"Mail {ADDRESS} now. " + "ok " * 40, usage=(12, 34)))
    await harness.executor(App([Model])).execute(request("model"))
    events = harness.events()
    text = "".join(e.text_delta.text for e in events if e.WhichOneof("kind") == "text_delta")
    assert "@" not in text
    assert "jane" not in text
    assert events[-1].error.code == "governance.response_blocked"


@agent(name="long")
class Long:
    """A long answer with an email deep inside it."""

    @prompt
    async def on_prompt(self, message: str, session: StreamingSession) -> None:
        text = "plain words here " * 8000 + f"reach {ADDRESS} now " + "tail " * 100
        for start in range(0, len(text), 500):
            await session.send(text[start : start + 500])


async def test_a_long_answer_is_checked_in_bounded_windows_and_still_caught(bare: Harness) -> None:
    harness = bare
    governance = PiiGovernance()
    await _with(harness, governance)
    await harness.executor(App([Long])).execute(request("long"))
    events = harness.events()
    sent = "".join(e.text_delta.text for e in events if e.WhichOneof("kind") == "text_delta")
    assert "@" not in sent
    assert len(sent) > 100_000  # the clean part streamed
    assert events[-1].error.code == "governance.response_blocked"
    assert max(len(c.response) for c in governance.checks) <= CHECK_WINDOW  # never the whole answer
    lengths = [c.response_chars for c in governance.checks]
    assert lengths == sorted(lengths)
    assert lengths[-1] > CHECK_WINDOW


async def test_a_run_end_governance_did_not_take_is_sent_again_until_it_does(bare: Harness) -> None:
    harness = bare
    admits = Router()

    async def admit(_request: AdmitRequest, _ctx: MessageContext) -> Decision:
        return Decision(allowed=True, policy="p")

    admits.add(subjects.governance("admit"), AdmitRequest, admit)
    await harness.stack.enter_async_context(harness.bus.serve(admits))
    await harness.executor(APP).execute(request("clean"))
    assert kinds(harness.events())[-1] == "complete"  # the terminal did not wait for governance
    ended: list[RunEndedReport] = []

    async def run_ended(report: RunEndedReport, _ctx: MessageContext) -> RunEndedAck:
        ended.append(report)
        return RunEndedAck(tenant="__default__", priced=True)

    ends = Router()  # governance is back, now answering run ends
    ends.add(subjects.governance("run_ended"), RunEndedReport, run_ended)
    await harness.stack.enter_async_context(harness.bus.serve(ends))

    async def reported() -> bool:
        return bool(ended)

    await wait_until(reported, what="the run's end to reach governance")
    assert ended[0].run_id == "r1"
    assert ended[0].succeeded
