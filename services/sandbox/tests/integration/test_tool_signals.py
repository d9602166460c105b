"""A tool's own signals (`ToolError`, `ModelRetry`, `ApprovalRequired`) as the sandbox answers them.

Each test runs with the tools in-process and in a tool worker (`executor`): the signals travel
back from a worker exactly as they are answered in-process.
"""

from __future__ import annotations

import json

import pytest

from atmosphere.bus import subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolReply
from atmosphere.sandbox.handlers import ToolExecutor, ToolHost
from atmosphere.sdk import ApprovalRequired, ModelRetry, ToolError, tool, tool_call_approved
from atmosphere.sdk.host import APPROVED_ARGUMENT, RETRY_SUFFIX

pytestmark = pytest.mark.asyncio(loop_scope="module")  # one tool worker for the module (`executor`)


@tool
def refuse(city: str) -> str:
    """Fails on purpose."""
    raise ToolError(f"no station in {city}")


@tool
def retry() -> str:
    """Asks for another try."""
    raise ModelRetry("use an ISO date")


@tool
def guarded(amount: int) -> str:
    """Asks first."""
    if not tool_call_approved():
        raise ApprovalRequired(f"Pay {amount}?")
    return f"paid {amount}"


TOOLS = {t.name: t for t in (refuse, retry, guarded)}


async def call(name: str, arguments: dict[str, object], executor: ToolExecutor | None) -> ToolReply:
    bus = FakeBus()
    async with bus.serve(ToolHost(TOOLS, executor=executor).router()):
        request = ToolCall(call_id="c1", name=name, arguments_json=json.dumps(arguments))
        return await bus.request(subjects.tool(name), request, ToolReply)


async def test_tool_error_is_an_error_with_the_tools_message(executor: ToolExecutor | None) -> None:
    result = await call("refuse", {"city": "Atlantis"}, executor)
    assert (result.content, result.is_error) == ("Error: no station in Atlantis", True)


async def test_model_retry_asks_the_model_to_fix_and_try_again(executor: ToolExecutor | None) -> None:
    result = await call("retry", {}, executor)
    assert (result.content, result.is_error) == (f"Error: use an ISO date\n\n{RETRY_SUFFIX}", True)


async def test_approval_required_is_a_request_not_a_failure(executor: ToolExecutor | None) -> None:
    result = await call("guarded", {"amount": 9}, executor)
    assert not result.is_error
    assert result.content == ""
    [event] = result.events
    assert event.WhichOneof("kind") == "approval_required"
    assert event.approval_required.message == "Pay 9?"
    assert event.approval_required.tool_name == "guarded"
    assert json.loads(event.approval_required.arguments_json) == {"amount": 9}


async def test_an_approved_call_runs(executor: ToolExecutor | None) -> None:
    result = await call("guarded", {"amount": 9, APPROVED_ARGUMENT: True}, executor)
    assert (result.content, result.is_error, list(result.events)) == ("paid 9", False, [])
