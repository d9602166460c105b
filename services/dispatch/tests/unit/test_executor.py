import asyncio
import json

import pytest

from atmosphere.bus import Envelope, Headers, JetStreamLayout, StreamUnavailableError, Term, WorkItem, subjects
from atmosphere.bus.runs import EVENT_LOST_METADATA_KEY, RESUMED_METADATA_KEY
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.run.v1.run_pb2 import (
    ApprovalDecision,
    Cancel,
    Control,
    ControlAck,
    RunEvent,
    RunSubmission,
    TextDelta,
)
from atmosphere.dispatch.handlers import agent_descriptors
from atmosphere.dispatch.model_side import NO_RUNTIME, ModelSide
from atmosphere.dispatch.sandbox_port import TOOL_REPLY_GRACE
from atmosphere.sdk import (
    AiBudget,
    AiInterceptor,
    AiRequest,
    App,
    StreamingSession,
    ToolLoopPolicy,
    agent,
    prompt,
    tool,
)
from atmosphere.sdk.host import APPROVED_ARGUMENT
from atmosphere.testing import ToolCallScript, Turn, wait_until

from .conftest import Harness, kinds, request


@agent(name="echo")
class Echo:
    @prompt
    async def on_prompt(self, message: str, session: StreamingSession) -> None:
        for word in message.split():
            await session.send(word)


@agent(name="broken")
class Broken:
    @prompt
    async def on_prompt(self, message: str, session: StreamingSession) -> None:
        await session.send("partial")
        raise KeyError("secret-internal-detail")


@agent(name="stranded")
class Stranded:
    @prompt
    async def on_prompt(self, message: str, session: StreamingSession) -> None:
        await session.send("partial")
        raise StreamUnavailableError("atmo.run.r4.evt")  # what a writer raises when no leader came back


@agent(name="polite")
class Polite:
    @prompt
    async def on_prompt(self, message: str, session: StreamingSession) -> None:
        await session.error("cannot help with that", code="agent.refused")
        await session.send("ignored")


@tool
def weather(city: str) -> str:
    """Weather in a city."""
    return "unused: the stand-in sandbox answers"


@tool(timeout=0.2)
def slow(city: str) -> str:
    """A tool with a short deadline."""
    return "unused"


@tool(requires_approval=True)
def delete_file(path: str) -> str:
    """Delete a file (asks for approval)."""
    return "unused"


@agent(name="model", system_prompt="Be brief.", tools=[weather, slow, delete_file])
class Model:
    """Answers with the model."""


@agent(name="frugal", budget=AiBudget(max_total_tokens=10))
class Frugal:
    pass


@agent(name="hasty", budget=AiBudget(max_wall_clock=0.3))
class Hasty:
    pass


@agent(name="strict", tools=[weather], tool_loop=ToolLoopPolicy.strict(1))
class Strict:
    pass


ORDER: list[str] = []


class First(AiInterceptor):
    async def pre_process(self, request: AiRequest) -> AiRequest:
        ORDER.append("pre:first")
        return request.with_message(request.message + " [first]")

    async def post_process(self, request: AiRequest, response: str) -> None:
        ORDER.append(f"post:first:{response}")


class Second(AiInterceptor):
    async def pre_process(self, request: AiRequest) -> AiRequest:
        ORDER.append("pre:second")
        return request.with_message(request.message + " [second]")

    async def post_process(self, request: AiRequest, response: str) -> None:
        ORDER.append("post:second")


@agent(name="intercepted", interceptors=[First, Second()])
class Intercepted:
    pass


APP = App(agents=[Echo, Broken, Stranded, Polite, Model, Frugal, Hasty, Strict, Intercepted])


async def test_events_are_numbered_from_two_and_stamped(harness: Harness) -> None:
    await harness.executor(APP, text_delta_window=0).execute(request("echo"))  # each delta its own event
    events = harness.events()
    assert [e.seq for e in events] == [2, 3, 4, 5]
    assert kinds(events) == ["text_delta"] * 3 + ["complete"]
    assert all((e.run_id, e.session_id, e.conversation_id, e.agent) == ("r1", "s1", "c1", "echo") for e in events)
    assert all(e.timestamp.seconds > 0 for e in events)
    assert [a.agent for a in harness.policy.admissions] == ["echo"]


async def test_unknown_agents_and_crashes_end_with_clear_errors(harness: Harness) -> None:
    executor = harness.executor(APP)
    await executor.execute(request("ghost", run_id="r1"))
    [event] = harness.events("r1")
    assert (event.error.code, event.error.message) == ("dispatch.unknown_agent", "Unknown agent 'ghost'")

    await executor.execute(request("broken", run_id="r2"))
    events = harness.events("r2")
    assert kinds(events) == ["text_delta", "error"]
    assert events[-1].error.message == "KeyError"
    assert b"secret" not in events[-1].SerializeToString()

    await executor.execute(request("polite", run_id="r3"))
    assert kinds(harness.events("r3")) == ["error"]

    # The broker failing the run is a retryable error of the catalogue, in words: the client never
    # reads an internal exception's name (`agent.failed: StreamUnavailableError` once).
    await executor.execute(request("stranded", run_id="r4"))
    failed = harness.events("r4")[-1].error
    assert (failed.code, failed.retryable) == ("bus.unavailable", True)
    assert "Error" not in failed.message
    assert "a stream had no leader" in failed.message


async def test_admission_fails_closed(harness: Harness) -> None:
    harness.policy.admit = False
    await harness.executor(APP).execute(request("echo"))
    [denied] = harness.events()
    assert denied.error.message == "Request denied by policy test-policy: not allowed here"
    assert dict(denied.error.details) == {"policy": "test-policy", "reason": "not allowed here"}

    bus = FakeBus()  # no governance at all
    await bus.provision(JetStreamLayout())
    harness.bus = bus
    # Refused once its (short) deadline passes with no answer: the default 5 s, shortened.
    await harness.executor(APP, governance_timeout=0.3).execute(request("echo", run_id="r9"))
    [refused] = harness.events("r9")
    assert refused.error.code == "governance.unavailable"
    assert refused.error.message == "Request denied: governance is unavailable (fail-closed)"


async def test_without_a_runtime_streaming_says_what_to_configure(harness: Harness) -> None:
    await harness.executor(APP, with_runtime=False).execute(request("model"))
    [event] = harness.events()
    assert event.error.message == NO_RUNTIME


async def test_a_model_run_with_tools(harness: Harness) -> None:
    await harness.serve_tools({"weather": "sunny, 22C"})
    harness.provider.script(
        Turn.tool_calls(ToolCallScript("weather", {"city": "Paris"}, call_id="c1"), usage=(20, 5)),
        Turn.text("Sunny in Paris.", usage=(30, 4)),
    )
    await harness.executor(APP, text_delta_window=0).execute(request("model", "Weather in Paris?"))
    events = harness.events()
    assert [k for k in kinds(events) if k != "tool_call_delta"] == [
        "input",
        "usage",
        "tool_start",
        "tool_result",
        "text_delta",
        "text_delta",
        "text_delta",
        "usage",
        "complete",
    ]
    start = next(e.tool_start for e in events if e.WhichOneof("kind") == "tool_start")
    assert (start.tool_name, json.loads(start.arguments_json)) == ("weather", {"city": "Paris"})
    [call] = harness.tool_calls
    assert (call.run_id, call.agent, json.loads(call.arguments_json)) == ("r1", "model", {"city": "Paris"})
    assert [c.tool_name for c in harness.policy.checks] == ["weather"]
    assert harness.provider.requests[0]["messages"][0] == {"role": "system", "content": "Be brief."}


async def test_refused_and_failing_tool_calls_tell_the_model(harness: Harness) -> None:
    harness.policy.tools = False
    await harness.serve_tools({"weather": "sunny"})
    harness.provider.script(Turn.tool_calls(ToolCallScript("weather", {"city": "Paris"})), Turn.text("ok"))
    await harness.executor(APP).execute(request("model", run_id="deny"))
    assert "tool_start" not in kinds(harness.events("deny"))
    told = harness.provider.requests[-1]["messages"][-1]["content"]
    assert json.loads(told) == {
        "status": "cancelled",
        "message": "Tool weather denied by policy 'test-policy': not allowed here",
    }

    harness.provider.script(Turn.tool_calls(ToolCallScript("weather", {"town": "Paris"})), Turn.text("ok"))
    await harness.executor(APP).execute(request("model", run_id="invalid"))
    assert "tool_start" not in kinds(harness.events("invalid"))
    assert json.loads(harness.provider.requests[-1]["messages"][-1]["content"]) == {
        "error": "invalid_arguments",
        "tool": "weather",
        "details": ["city: field required", "town: unexpected field"],
    }


async def test_tool_timeouts_and_missing_sandboxes_are_tool_errors(harness: Harness) -> None:
    # A sandbox that never answers (it enforces deadlines itself, so dispatch waits the grace more).
    await harness.serve_tools({"slow": "late"}, delay=TOOL_REPLY_GRACE + 1.0)
    harness.provider.script(Turn.tool_calls(ToolCallScript("slow", {"city": "X"})), Turn.text("ok"))
    await harness.executor(APP).execute(request("model", run_id="t1"))
    [error] = [e.tool_error for e in harness.events("t1") if e.WhichOneof("kind") == "tool_error"]
    assert json.loads(error.error)["error"] == "tool_timeout"
    assert "deadline" in json.loads(error.error)["message"]

    harness.provider.script(Turn.tool_calls(ToolCallScript("weather", {"city": "X"})), Turn.text("ok"))
    await harness.executor(APP).execute(request("model", run_id="t2"))
    [error] = [e.tool_error for e in harness.events("t2") if e.WhichOneof("kind") == "tool_error"]
    assert error.error == "Error: no sandbox serves the tool weather right now"
    assert kinds(harness.events("t2"))[-1] == "complete"


async def test_tool_governance_that_does_not_answer_refuses_the_call(harness: Harness) -> None:
    await harness.serve_tools({"weather": "sunny"})
    harness.policy.check_delay = 1.0
    harness.provider.script(Turn.tool_calls(ToolCallScript("weather", {"city": "X"})), Turn.text("ok"))
    await harness.executor(APP, governance_timeout=0.2).execute(request("model"))
    [error] = [e.tool_error for e in harness.events() if e.WhichOneof("kind") == "tool_error"]
    assert "refused (fail-closed)" in error.error
    assert "tool_start" not in kinds(harness.events())
    assert harness.tool_calls == []


async def test_approval_gates(harness: Harness) -> None:
    await harness.serve_tools({"delete_file": "deleted"})
    executor = harness.executor(APP)

    async def decide(run_id: str, action: str, payload: str = "") -> None:
        async def pending() -> bool:
            return any(e.WhichOneof("kind") == "approval_required" for e in harness.events(run_id))

        await wait_until(pending, what="the approval request")
        approval = next(
            e.approval_required for e in harness.events(run_id) if e.WhichOneof("kind") == "approval_required"
        )
        assert approval.approval_id.startswith("apr_")
        assert len(approval.approval_id) == 16
        ack = await harness.bus.request(
            subjects.run_control(run_id),
            Control(
                run_id=run_id,
                approval=ApprovalDecision(approval_id=approval.approval_id, action=action, payload_json=payload),
            ),
            ControlAck,
        )
        assert ack.accepted

    for run_id, action, payload in (("yes", "approve", '{"arguments": {"path": "/tmp/b"}}'), ("no", "deny", "")):
        harness.provider.script(Turn.tool_calls(ToolCallScript("delete_file", {"path": "/tmp/a"})), Turn.text("done"))
        await asyncio.gather(executor.execute(request("model", run_id=run_id)), decide(run_id, action, payload))
    # The edited arguments ran, marked approved (the tool's `tool_call_approved()` is true).
    assert [json.loads(c.arguments_json) for c in harness.tool_calls] == [{"path": "/tmp/b", APPROVED_ARGUMENT: True}]
    denied = harness.provider.requests[-1]["messages"][-1]["content"]
    assert json.loads(denied) == {"status": "cancelled", "message": "Action cancelled by user"}


async def test_a_client_cancel_ends_the_run_and_closes_the_model_call(harness: Harness) -> None:
    harness.provider.script(Turn.stalled("Thinking", seconds=30))
    run = asyncio.create_task(harness.executor(APP).execute(request("model")))

    async def streaming() -> bool:
        return any(e.WhichOneof("kind") == "text_delta" for e in harness.events())

    await wait_until(streaming)
    ack = await harness.bus.request(
        subjects.run_control("r1"), Control(run_id="r1", cancel=Cancel(reason="bored")), ControlAck
    )
    assert ack.accepted
    await asyncio.wait_for(run, 2)
    await asyncio.wait_for(harness.provider.disconnected.wait(), 1)
    last = harness.events()[-1]
    assert (last.error.code, last.error.message) == ("run.cancelled", "Run cancelled: bored")


async def test_budgets_end_the_run_with_one_error(harness: Harness) -> None:
    harness.provider.script(Turn.text("A long answer", usage=(8, 6)))
    await harness.executor(APP).execute(request("frugal", run_id="tokens"))
    events = harness.events("tokens")
    assert kinds(events)[-1] == "error"
    assert events[-1].error.message == "AI budget exceeded: TOTAL_TOKENS observed=14tokens > limit=10tokens"
    assert "complete" not in kinds(events)

    harness.provider.script(Turn.stalled("Slow", seconds=30))
    await harness.executor(APP).execute(request("hasty", run_id="clock"))
    events = harness.events("clock")
    assert [k for k in kinds(events) if k in {"error", "complete"}] == ["error"]
    assert events[-1].error.message.startswith("AI budget exceeded: WALL_CLOCK observed=")
    assert events[-1].error.message.endswith("ms > limit=300ms")


async def test_a_strict_tool_loop_is_an_error_frame(harness: Harness) -> None:
    await harness.serve_tools({"weather": "sunny"})
    harness.provider.script(*[Turn.tool_calls(ToolCallScript("weather", {"city": "X"})) for _ in range(2)])
    await harness.executor(APP).execute(request("strict"))
    assert harness.events()[-1].error.message == "Tool loop exhausted after 1 iterations"


async def test_interceptors_run_fifo_before_and_lifo_after(harness: Harness) -> None:
    ORDER.clear()
    harness.provider.script(Turn.text("fine"))
    await harness.executor(APP).execute(request("intercepted", "hello"))
    assert harness.provider.requests[0]["messages"][-1]["content"] == "hello [first] [second]"
    assert ORDER == ["pre:first", "pre:second", "post:second", "post:first:fine"]


async def test_a_redelivered_run_is_resumed_or_acknowledged(harness: Harness) -> None:
    executor = harness.executor(APP)
    await harness.bus.publish(subjects.run_events("r1"), RunEvent(run_id="r1", seq=1))
    # The first worker sent part of the answer, then died.
    await harness.bus.publish(subjects.run_events("r1"), RunEvent(run_id="r1", seq=2, text_delta=TextDelta(text="x")))
    await executor.on_work(work_item(request("echo", "x y"), delivered=2))
    events = harness.events()
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[2].metadata.key == RESUMED_METADATA_KEY
    # The stream goes on from its last seq with only what is new: no text is sent twice.
    assert "".join(e.text_delta.text for e in events if e.WhichOneof("kind") == "text_delta") == "xy"
    assert kinds(events)[-1] == "complete"
    assert await executor._stored_unless_ended(request("echo")) is None  # it has its terminal now


def test_descriptors_carry_runtime_truth() -> None:
    without = {d.name: d for d in agent_descriptors(APP, ModelSide(None))}
    assert without["model"].runtime == ""
    assert without["model"].capabilities == []
    assert list(without["model"].tools) == ["weather", "slow", "delete_file"]
    assert without["echo"].path == "/atmosphere/agent/echo"


def work_item(run: RunSubmission, delivered: int) -> WorkItem[RunSubmission]:
    return WorkItem(Envelope(subjects.run_submit("echo"), run, Headers()), stream_seq=1, delivered=delivered)


async def test_a_run_that_failed_on_every_delivery_is_ended_not_tried_again(harness: Harness) -> None:
    executor = harness.executor(APP, max_deliveries=3)
    await harness.bus.publish(subjects.run_events("r1"), RunEvent(run_id="r1", seq=1))
    await executor.on_work(work_item(request("model", "hi"), delivered=3))
    events = harness.events()
    assert kinds(events) == ["", "error"]
    assert events[-1].error.code == "dispatch.run_abandoned"
    assert events[-1].error.details["deliveries"] == "3"
    assert harness.provider.requests == []  # the poison run never reached the model again


async def test_a_run_below_the_delivery_bound_is_re_driven(harness: Harness) -> None:
    executor = harness.executor(APP, max_deliveries=3)
    await harness.bus.publish(subjects.run_events("r1"), RunEvent(run_id="r1", seq=1))
    await executor.on_work(work_item(request("echo", "again"), delivered=2))
    events = harness.events()
    assert kinds(events)[-1] == "complete"
    assert [e.seq for e in events] == list(range(1, len(events) + 1))


async def test_events_lost_with_a_dead_worker_are_marked_so_readers_go_on(harness: Harness) -> None:
    executor = harness.executor(APP)
    for seq in (1, 2, 5):  # 3 and 4 were in flight when the worker and the broker both died
        await harness.bus.publish(subjects.run_events("r1"), RunEvent(run_id="r1", seq=seq))
    stored = await executor._stored_unless_ended(request("echo"))
    assert stored is not None
    assert await executor._resume_point(request("echo"), stored) == 6
    markers = {e.seq: e.metadata.key for e in harness.events() if e.WhichOneof("kind") == "metadata"}
    assert markers == {3: EVENT_LOST_METADATA_KEY, 4: EVENT_LOST_METADATA_KEY}


@pytest.mark.parametrize(("run_id", "agent"), [("", "echo"), ("a b", "echo"), ("r1", ""), ("r1", "x.>")])
async def test_a_malformed_run_request_is_dropped_for_good(harness: Harness, run_id: str, agent: str) -> None:
    executor = harness.executor(APP)
    with pytest.raises(Term):
        await executor.on_work(work_item(RunSubmission(run_id=run_id, agent=agent, message="hi"), delivered=1))


async def test_a_message_a_policy_rewrote_is_what_the_model_gets(harness: Harness) -> None:
    harness.policy.rewrite = "Call me at [redacted-phone]"
    harness.provider.script(Turn.text("Sure."))
    await harness.executor(APP).execute(request("model", "Call me at +1 555 123 4567"))
    assert harness.provider.requests[0]["messages"][-1] == {"role": "user", "content": "Call me at [redacted-phone]"}


async def test_a_run_redelivered_to_the_worker_still_running_it_runs_once(harness: Harness) -> None:
    harness.provider.script(Turn.text("only once", chunk_delay=0.05))
    executor = harness.executor(APP)
    run = request("model", "hi")
    first = asyncio.create_task(executor.on_work(work_item(run, 1)))
    await wait_until(lambda: _has_text(harness), what="the run to stream")
    await executor.on_work(work_item(run, 2))  # waits for the execution in hand, starts none
    await first
    assert len(harness.provider.requests) == 1
    assert kinds(harness.events()).count("complete") == 1


async def _has_text(harness: Harness) -> bool:
    return "text_delta" in kinds(harness.events())
