"""The sandbox's own tools (`code_exec`, `eval`) reach every agent only while a sandbox offers them.

And a run's code session stays with the sandbox instance that holds it: later calls go to that
instance, the run's end releases it, and an instance that is gone hands the call back to any replica.
"""

from __future__ import annotations

import json

from atmosphere.bus import MessageContext, Router, subjects
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolDescriptor, ToolKind, ToolReply
from atmosphere.dispatch.sandbox_tools import CODE_EXEC_TOOL_LOOP_CAP, tool_loop_for
from atmosphere.sdk import App, ToolLoopPolicy, agent, tool
from atmosphere.sdk.runtime import ToolSpec
from atmosphere.testing import ToolCallScript, Turn

from .conftest import Harness, kinds, request


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@agent(name="coder", system_prompt="Write code.", tools=[weather])
class Coder:
    """Runs code when the sandbox allows it."""


APP = App(agents=[Coder])
SCHEMA = {"type": "object", "properties": {"language": {"type": "string"}, "code": {"type": "string"}}}


def code_exec_descriptor(provider: str = "sandbox") -> ToolDescriptor:
    return ToolDescriptor(
        name="code_exec",
        description="Run code in an isolated sandbox.",
        parameters_json_schema=json.dumps(SCHEMA),
        kind=ToolKind.TOOL_KIND_EXECUTE,
        timeout_seconds=30,
        provider=provider,
    )


def offered_names(harness: Harness) -> list[str]:
    return [t["function"]["name"] for t in harness.provider.requests[-1].get("tools", [])]


async def test_code_exec_is_offered_only_while_a_sandbox_publishes_it(harness: Harness) -> None:
    harness.provider.script(Turn.text("no code"))
    await harness.executor(APP).execute(request("coder", run_id="before"))
    assert offered_names(harness) == ["weather"]

    await harness.bus.kv_put(subjects.TOOLS_BUCKET, "code_exec", code_exec_descriptor(provider="memory"))
    harness.provider.script(Turn.text("still none"))
    await harness.executor(APP).execute(request("coder", run_id="not-sandbox"))
    assert offered_names(harness) == ["weather"]  # only a sandbox may offer it

    await harness.bus.kv_put(subjects.TOOLS_BUCKET, "code_exec", code_exec_descriptor())
    harness.provider.script(Turn.text("now code"))
    await harness.executor(APP).execute(request("coder", run_id="after"))
    assert sorted(offered_names(harness)) == ["code_exec", "weather"]
    [offered] = [t for t in harness.provider.requests[-1]["tools"] if t["function"]["name"] == "code_exec"]
    assert offered["function"]["parameters"] == SCHEMA


def test_code_exec_raises_the_tool_loop_cap_to_25() -> None:
    code = {"code_exec": ToolSpec(name="code_exec", description="", parameters={})}
    assert tool_loop_for(ToolLoopPolicy.DEFAULT, code).cap == CODE_EXEC_TOOL_LOOP_CAP == 25
    assert tool_loop_for(ToolLoopPolicy.DEFAULT, {}).cap == 5
    assert tool_loop_for(ToolLoopPolicy.max_iterations(40), code).cap == 40  # never lowered
    strict = tool_loop_for(ToolLoopPolicy.strict(3), code)
    assert (strict.cap, strict.on_max_iterations) == (25, ToolLoopPolicy.strict(3).on_max_iterations)


def session_router(calls: list[tuple[str, ToolCall]], *, instance: str) -> Router:
    """A sandbox replica: a first call starts a session here (it names the instance), later ones reuse it."""
    router = Router()

    async def first(call: ToolCall, _ctx: MessageContext) -> ToolReply:
        calls.append(("any", call))
        return ToolReply(call_id=call.call_id, content='{"exitCode": 0}', session_instance=instance)

    async def again(call: ToolCall, _ctx: MessageContext) -> ToolReply:
        calls.append((instance, call))
        return ToolReply(call_id=call.call_id, content='{"exitCode": 0}', session_instance=instance)

    router.add(subjects.tool("code_exec"), ToolCall, first)
    router.add(subjects.sandbox_session_tool(instance, "code_exec"), ToolCall, again)
    return router


def code_round(n: int) -> Turn:
    return Turn.tool_calls(ToolCallScript("code_exec", {"language": "python", "code": f"print({n})"}, call_id=f"c{n}"))


async def test_a_runs_later_code_calls_go_to_the_instance_holding_its_session_and_its_end_releases_it(
    harness: Harness,
) -> None:
    await harness.bus.kv_put(subjects.TOOLS_BUCKET, "code_exec", code_exec_descriptor())
    calls: list[tuple[str, ToolCall]] = []
    await harness.stack.enter_async_context(harness.bus.serve(session_router(calls, instance="box1")))
    releases = await harness.stack.enter_async_context(
        harness.bus.subscribe(subjects.sandbox_release("box1"), ToolCall)
    )
    # Six rounds: more than the default cap of 5, which code_exec raises to 25.
    harness.provider.script(*(code_round(n) for n in range(6)), Turn.text("done"))
    await harness.executor(APP).execute(request("coder", run_id="session"))

    events = harness.events("session")
    assert kinds(events)[-1] == "complete"
    assert [where for where, _ in calls] == ["any"] + ["box1"] * 5
    assert {call.run_id for _, call in calls} == {"session"}
    release = await releases.receive(timeout=5)
    assert release is not None
    assert (release.message.run_id, release.message.name) == ("session", "code_exec")


async def test_a_session_whose_instance_is_gone_starts_again_on_any_replica(harness: Harness) -> None:
    await harness.bus.kv_put(subjects.TOOLS_BUCKET, "code_exec", code_exec_descriptor())
    calls: list[tuple[str, ToolCall]] = []
    router = Router()

    async def first(call: ToolCall, _ctx: MessageContext) -> ToolReply:
        calls.append(("any", call))
        # Names an instance that serves nothing (it died after answering).
        return ToolReply(call_id=call.call_id, content='{"exitCode": 0}', session_instance="gone")

    router.add(subjects.tool("code_exec"), ToolCall, first)
    await harness.stack.enter_async_context(harness.bus.serve(router))
    harness.provider.script(code_round(1), code_round(2), Turn.text("done"))
    await harness.executor(APP).execute(request("coder", run_id="lost"))

    assert kinds(harness.events("lost"))[-1] == "complete"
    assert [where for where, _ in calls] == ["any", "any"]
    results = [e.tool_result for e in harness.events("lost") if e.WhichOneof("kind") == "tool_result"]
    assert len(results) == 2
