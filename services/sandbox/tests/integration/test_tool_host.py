"""`ToolHost` answers: validated arguments, failures as error results; in-process and in a tool worker alike."""

import asyncio
import json

import pytest

from atmosphere.bus import JetStreamLayout, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolReply
from atmosphere.sandbox.handlers import ToolExecutor, ToolHost, descriptors, runtime_info
from atmosphere.sdk import tool

pytestmark = pytest.mark.asyncio(loop_scope="module")  # one tool worker for the module (`executor`)


@tool
async def add(a: int, b: int = 1) -> int:
    """Add two integers."""
    return a + b


@tool
def explode(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(reason)


@tool
def shy() -> str:
    """Fails without a message."""
    raise KeyError


@tool(timeout=0.1)
async def sleepy() -> str:
    """Too slow."""
    await asyncio.sleep(5)
    return "late"


TOOLS = {t.name: t for t in (add, explode, shy, sleepy)}


async def call(name: str, arguments: str, executor: ToolExecutor | None) -> ToolReply:
    bus = FakeBus()
    async with bus.serve(ToolHost(TOOLS, executor=executor).router()):
        return await bus.request(
            subjects.tool(name), ToolCall(call_id="c1", name=name, arguments_json=arguments), ToolReply
        )


async def test_a_tool_runs_with_validated_arguments(executor: ToolExecutor | None) -> None:
    result = await call("add", '{"a": 2, "b": "3"}', executor)
    assert (result.call_id, result.content, result.is_error) == ("c1", "5", False)
    assert (await call("add", '{"a": 2}', executor)).content == "3"


async def test_failures_are_error_results_without_tracebacks(executor: ToolExecutor | None) -> None:
    boom = await call("explode", '{"reason": "disk full"}', executor)
    assert (boom.content, boom.is_error) == ("Error: disk full", True)
    assert (await call("shy", "{}", executor)).content == "Error: KeyError"
    assert (await call("sleepy", "{}", executor)).content == "Error: sleepy did not finish within 0.1s"
    assert (await call("add", "[1]", executor)).content == "Error: the arguments must be a JSON object"
    assert (await call("add", "{nope", executor)).content == "Error: the arguments are not valid JSON"
    invalid = json.loads((await call("add", '{"a": "x", "c": 1}', executor)).content)
    assert invalid["error"] == "invalid_arguments"
    assert any(d.startswith("a:") for d in invalid["details"])
    assert any(d.startswith("c:") for d in invalid["details"])


async def test_descriptors_and_runtime_truth() -> None:
    by_name = {d.name: d for d in descriptors(TOOLS)}
    assert json.loads(by_name["add"].parameters_json_schema)["required"] == ["a"]
    assert by_name["add"].provider == "sandbox"
    assert runtime_info(TOOLS) == {"sandbox": {"tools": ["add", "explode", "shy", "sleepy"]}}
    assert runtime_info({}) == {}
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
