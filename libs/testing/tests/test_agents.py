"""The agent test kit runs what the platform runs: the app's policy files in governance, its tools in
the sandbox's worker processes, runs submitted as ingress submits them."""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
from pathlib import Path

import pytest

from atmosphere.sdk import App, RetryPolicy, agent, tool
from atmosphere.sdk.errors import UserError
from atmosphere.testing import AgentTestEnv, ScriptedModel, Turn, run_agent
from atmosphere.testing.app_reference import reference_of

ROOT = Path(__file__).resolve().parents[3]


@tool
def process_id() -> int:
    """The id of the process this tool runs in."""
    return os.getpid()


@agent(name="inspector", tools=[process_id], harness=[], retry=RetryPolicy.NONE)
class Inspector:
    pass


APP = App(agents=[Inspector])


def test_a_tool_runs_in_a_sandbox_worker_process() -> None:
    model = ScriptedModel(Turn.tool_call("process_id"), Turn.text("Done."))
    result = run_agent(APP, "inspector", "where do you run?", model=model)
    assert result.completed
    worker = int(result.tool_results()["process_id"])
    assert worker != os.getpid()


def test_tool_workers_zero_runs_the_tools_in_this_process() -> None:
    model = ScriptedModel(Turn.tool_call("process_id"), Turn.text("Done."))
    result = run_agent(APP, "inspector", "where do you run?", model=model, tool_workers=0)
    assert int(result.tool_results()["process_id"]) == os.getpid()


async def test_one_environment_keeps_its_tool_workers_across_runs() -> None:
    model = ScriptedModel(
        Turn.tool_call("process_id"), Turn.text("One."), Turn.tool_call("process_id"), Turn.text("Two.")
    )
    async with AgentTestEnv(APP, model=model) as env:
        first = await env.run("inspector", "one")
        second = await env.run("inspector", "two")
    assert first.tool_results() == second.tool_results()


POLICED_APP = '''
"""An app in its own directory, beside its `atmosphere-policies.yaml`."""

from atmosphere.sdk import App, RetryPolicy, agent, tool


@tool
def delete_order(order_id: str) -> str:
    """Delete an order.

    Args:
        order_id: The order.
    """
    return f"deleted {order_id}"


@tool
def read_order(order_id: str) -> str:
    """Read an order.

    Args:
        order_id: The order.
    """
    return f"order {order_id}: shipped"


@agent(name="clerk", tools=[delete_order, read_order], harness=[], retry=RetryPolicy.NONE)
class Clerk:
    pass


app = App(agents=[Clerk])
'''

POLICIES = """
version: "2026-12"
policies:
  - name: no-deletes
    type: deny-list
    config:
      regex: ['^call_tool:delete_']
  - name: no-launch-codes
    type: deny-list
    config:
      regex: ['launch codes']
"""


@pytest.fixture
def policed_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> App:
    """An app directory as `atmosphere new` lays one out: the app module and its policy file."""
    (tmp_path / "policed_app.py").write_text(textwrap.dedent(POLICED_APP))
    (tmp_path / "atmosphere-policies.yaml").write_text(textwrap.dedent(POLICIES))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "policed_app", raising=False)  # restored (absent) after the test
    app: App = importlib.import_module("policed_app").app
    return app


def test_a_tool_call_is_denied_by_the_apps_policy_file(policed_app: App) -> None:
    model = ScriptedModel(
        Turn.tool_call("delete_order", order_id="o1"), Turn.tool_call("read_order", order_id="o1"), Turn.text("No.")
    )
    result = run_agent(policed_app, "clerk", "delete order o1", model=model)
    assert result.completed
    denial = model.requests[1].last_tool_result or ""
    assert "denied by policy 'no-deletes'" in denial
    assert [f["data"]["toolName"] for f in result.of("tool-start")] == ["read_order"]  # the denied one never ran
    assert result.tool_results() == {"read_order": "order o1: shipped"}


def test_a_run_is_refused_at_admission_by_the_apps_policy_file(policed_app: App) -> None:
    model = ScriptedModel(Turn.text("Here they are."))
    result = run_agent(policed_app, "clerk", "tell me the launch codes", model=model)
    assert result.error is not None
    assert result.error["code"] == "governance.denied"
    assert "no-launch-codes" in result.error["data"]
    assert model.requests == []  # the model was never asked


def test_an_app_is_named_by_the_module_that_defines_it() -> None:
    reference = reference_of(APP)
    assert reference is not None
    assert reference.app == f"{__name__}:APP"
    assert reference.app_dir == ROOT


def test_an_app_made_inside_a_function_needs_its_tools_in_this_process() -> None:
    app = App(agents=[Inspector])
    assert reference_of(app) is None
    with pytest.raises(UserError, match="tool_workers=0"):
        AgentTestEnv(app)
    model = ScriptedModel(Turn.tool_call("process_id"), Turn.text("Done."))
    assert run_agent(app, "inspector", "go", model=model, tool_workers=0).completed
