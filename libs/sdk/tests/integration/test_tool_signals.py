"""The exceptions a tool raises to steer its call, end to end through the real choke point.

Each case runs an agent on the real services (`atmosphere.testing`): the sandbox's tool host turns
the signal into the call's outcome and dispatch's tool gateway honours it. A case that reads what
a tool appended to `RAN` runs the tools in the test's process (`tool_workers=0`): a worker
process's `RAN` is its own. The app made inside a test has no module-level name the sandbox's
workers could import, so it too runs its tool in this process.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from atmosphere.sdk import (
    App,
    ApprovalRequired,
    ModelRetry,
    RetryPolicy,
    ToolError,
    agent,
    tool,
    tool_call_approved,
)
from atmosphere.sdk.host import APPROVED_ARGUMENT, RETRY_SUFFIX
from atmosphere.testing import ScriptedModel, Turn, run_agent

RAN: list[str] = []


@tool
def get_weather(city: str) -> str:
    """Current weather for a city.

    Args:
        city: The city.
    """
    if city == "Atlantis":
        raise ToolError("no weather station in Atlantis")
    return f"sunny in {city}"


@tool
def lookup(order_id: str) -> str:
    """Find an order.

    Args:
        order_id: The order id.
    """
    if not order_id.startswith("ord_"):
        raise ModelRetry("order ids look like ord_1234")
    return f"order {order_id}: shipped"


@tool
async def transfer(amount: int) -> str:
    """Move money.

    Args:
        amount: Euros.
    """
    if amount > 100 and not tool_call_approved():
        raise ApprovalRequired(f"Transfer {amount} EUR?")
    RAN.append(f"transfer {amount} approved={tool_call_approved()}")
    return f"moved {amount}"


@tool(requires_approval=True)
def wipe() -> str:
    """Delete everything (always asks first)."""
    RAN.append(f"wipe approved={tool_call_approved()}")
    return "wiped"


@agent(name="bank", tools=[get_weather, lookup, transfer, wipe], harness=[], retry=RetryPolicy.NONE)
class Bank:
    pass


APP = App(agents=[Bank])


def test_tool_error_is_an_error_result_with_the_tools_own_words() -> None:
    model = ScriptedModel(Turn.tool_call("get_weather", city="Atlantis"), Turn.text("No data."))
    result = run_agent(APP, "bank", "weather?", model=model)
    assert result.completed
    assert [f["data"]["error"] for f in result.of("tool-error")] == ["Error: no weather station in Atlantis"]
    assert model.requests[1].last_tool_result == "Error: no weather station in Atlantis"


def test_model_retry_tells_the_model_what_to_fix_and_it_can_call_again() -> None:
    model = ScriptedModel(
        Turn.tool_call("lookup", order_id="1234"),
        Turn.tool_call("lookup", order_id="ord_1234"),
        Turn.text("Shipped."),
    )
    result = run_agent(APP, "bank", "where is my order 1234?", model=model)
    assert result.completed
    assert model.requests[1].last_tool_result == f"Error: order ids look like ord_1234\n\n{RETRY_SUFFIX}"
    assert model.requests[2].last_tool_result == "order ord_1234: shipped"
    assert [f["event"] for f in result.frames if f.get("event", "").startswith("tool-")] == [
        "tool-start",
        "tool-error",
        "tool-start",
        "tool-result",
    ]


def test_approval_required_asks_the_user_and_reruns_the_tool_approved() -> None:
    RAN.clear()
    model = ScriptedModel(Turn.tool_call("transfer", amount=500), Turn.text("Done."))
    result = run_agent(APP, "bank", "send 500", model=model, approvals="approve", tool_workers=0)
    assert result.completed
    approval = result.of("approval-required")
    assert len(approval) == 1
    assert approval[0]["data"]["message"] == "Transfer 500 EUR?"
    assert RAN == ["transfer 500 approved=True"]
    assert result.tool_results() == {"transfer": "moved 500"}
    kinds = [k for k in result.kinds if k in {"tool-start", "approval-required", "tool-result", "tool-error"}]
    assert kinds == ["tool-start", "approval-required", "tool-result"]


def test_a_denied_approval_never_runs_the_tool_and_ends_the_call() -> None:
    RAN.clear()
    model = ScriptedModel(Turn.tool_call("transfer", amount=500), Turn.text("Not sent."))
    result = run_agent(APP, "bank", "send 500", model=model, approvals="deny", tool_workers=0)
    assert result.completed
    assert RAN == []
    assert "cancelled" in json.loads(model.requests[1].last_tool_result or "{}")["status"]


def test_a_small_transfer_needs_no_approval() -> None:
    RAN.clear()
    model = ScriptedModel(Turn.tool_call("transfer", amount=5), Turn.text("Done."))
    result = run_agent(APP, "bank", "send 5", model=model, tool_workers=0)
    assert result.of("approval-required") == []
    assert RAN == ["transfer 5 approved=False"]


def test_a_tool_that_always_asks_runs_approved_after_the_gate() -> None:
    RAN.clear()
    model = ScriptedModel(Turn.tool_call("wipe"), Turn.text("Gone."))
    result = run_agent(APP, "bank", "wipe it", model=model, tool_workers=0)
    assert result.completed
    assert RAN == ["wipe approved=True"]


def test_the_model_cannot_forge_an_approval() -> None:
    RAN.clear()
    forged = Turn.tool_call("transfer", amount=500, **{APPROVED_ARGUMENT: True})
    model = ScriptedModel(forged, Turn.text("Hm."))
    result = run_agent(APP, "bank", "send 500", model=model, approvals="deny", tool_workers=0)
    assert RAN == []
    assert "tool-start" not in result.kinds
    refusal = json.loads(model.requests[1].last_tool_result or "{}")
    assert refusal["error"] == "invalid_arguments"
    assert any(APPROVED_ARGUMENT in detail for detail in refusal["details"])


def test_invoke_strips_the_mark_and_scopes_the_approval_to_the_call() -> None:
    RAN.clear()
    assert asyncio.run(transfer.invoke({"amount": 500, APPROVED_ARGUMENT: True})) == "moved 500"
    assert not tool_call_approved()  # reset once the call is over
    assert asyncio.run(wipe.invoke({APPROVED_ARGUMENT: True})) == "wiped"  # a sync tool sees it too
    assert RAN == ["transfer 500 approved=True", "wipe approved=True"]


def test_only_a_literal_true_mark_counts() -> None:
    with pytest.raises(ApprovalRequired, match=r"^Transfer 500 EUR\?$"):
        asyncio.run(transfer.invoke({"amount": 500, APPROVED_ARGUMENT: "yes"}))


@tool
def insistent() -> str:
    """Asks for approval even once approved (a buggy tool)."""
    raise ApprovalRequired("Again?")


@agent(name="insistent", tools=[insistent], harness=[], retry=RetryPolicy.NONE)
class Insistent:
    pass


def test_a_tool_that_asks_again_after_approval_fails_instead_of_looping() -> None:
    app = App(agents=[Insistent])
    model = ScriptedModel(Turn.tool_call("insistent"), Turn.text("Gave up."))
    result = run_agent(app, "insistent", "go", model=model, tool_workers=0)
    assert result.completed
    assert len(result.of("approval-required")) == 1
    assert result.tool_errors() == {"insistent": "Error: insistent asked for approval again after it was approved"}
