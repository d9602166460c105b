"""A hosted framework object's own tools at the choke point (`ToolCallRequest.local`).

The framework's tool runs in dispatch's process, but only after every gate a sandboxed `@tool`
passes: argument validation, governance's check, the result's injection screen; a refused call
never reaches it. No sandbox is on the bus here: a call that went there would fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from atmosphere.bus import JetStreamLayout, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.run.v1.run_pb2 import ApprovalDecision, Control, ControlAck, RunEvent, RunSubmission
from atmosphere.dispatch.control import RunControl
from atmosphere.dispatch.governance_client import GovernanceClient
from atmosphere.dispatch.permissions import ToolPermission, ToolPermissions
from atmosphere.dispatch.tools import ToolGateway
from atmosphere.sdk.runtime import ToolCallRequest, ToolSpec
from atmosphere.testing import wait_until

from .conftest import Policy, governance_router

REVERSE = ToolSpec(
    name="reverse",
    description="Reverse a text.",
    parameters={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
)


@dataclass
class Framework:
    """The framework object's own tool, as an adapter hands it to the choke point."""

    ran: list[str] = field(default_factory=list)

    async def reverse(self, arguments_json: str) -> str:
        self.ran.append(arguments_json)
        return json.loads(arguments_json)["text"][::-1]


@dataclass
class Bench:
    bus: FakeBus
    policy: Policy
    events: list[RunEvent] = field(default_factory=list)

    async def emit(self, event: RunEvent) -> None:
        self.events.append(event)

    control: RunControl = field(default_factory=lambda: RunControl("r1"))

    def gateway(self, permissions: ToolPermissions | None = None) -> ToolGateway:
        return ToolGateway(
            bus=self.bus,
            run=RunSubmission(run_id="r1", conversation_id="c1", agent="hosted"),
            emit=self.emit,
            tools={"reverse": REVERSE},
            control=self.control,
            governance=GovernanceClient(self.bus, timeout=0.5),
            permissions=permissions or ToolPermissions(),
        )

    def kinds(self) -> list[str]:
        return [e.WhichOneof("kind") or "" for e in self.events]


@contextlib.asynccontextmanager
async def bench_with(policy: Policy) -> AsyncIterator[Bench]:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    bench = Bench(bus, policy)
    async with bus.serve(governance_router(policy)), bus.serve(bench.control.router()):
        yield bench


@pytest.fixture
def framework() -> Framework:
    return Framework()


def call(framework: Framework, arguments: str = '{"text": "abc"}') -> ToolCallRequest:
    return ToolCallRequest(call_id="c1", name="reverse", arguments_json=arguments, local=framework.reverse)


async def test_an_allowed_call_runs_the_frameworks_tool_here_after_the_gates(framework: Framework) -> None:
    async with bench_with(Policy()) as bench:
        result = await bench.gateway().run_tool(call(framework))
    assert result == "cba"
    assert framework.ran == ['{"text": "abc"}']
    assert [c.tool_name for c in bench.policy.checks] == ["reverse"]  # governance saw it first
    assert [s.texts[0] for s in bench.policy.screens] == ["cba"]  # and screened the result
    assert bench.kinds() == ["tool_start", "tool_result"]
    assert bench.events[-1].tool_result.result == "cba"


async def test_a_call_governance_denies_never_reaches_the_framework(framework: Framework) -> None:
    async with bench_with(Policy(tools=False, reason="no reversing")) as bench:
        result = await bench.gateway().run_tool(call(framework))
    assert framework.ran == []
    assert json.loads(result) == {
        "status": "cancelled",
        "message": "Tool reverse denied by policy 'test-policy': no reversing",
    }


async def test_invalid_arguments_never_reach_the_framework(framework: Framework) -> None:
    async with bench_with(Policy()) as bench:
        result = await bench.gateway().run_tool(call(framework, '{"txt": 1}'))
    assert framework.ran == []
    assert json.loads(result) == {"error": "invalid_arguments", "tool": "reverse", "details": ["text: field required"]}
    assert bench.policy.checks == []


async def test_a_framework_tool_that_raises_is_an_error_for_the_model(framework: Framework) -> None:
    async def broken(_arguments_json: str) -> str:
        raise RuntimeError("boom")

    async with bench_with(Policy()) as bench:
        request = ToolCallRequest(call_id="c1", name="reverse", arguments_json='{"text": "abc"}', local=broken)
        result = await bench.gateway().run_tool(request)
    assert result.startswith("Error:")
    assert bench.kinds() == ["tool_start", "tool_error"]


async def test_an_approved_call_reaches_the_framework_with_the_approved_arguments_only(framework: Framework) -> None:
    # The mark that tells an app's `@tool` it was approved is the SDK's: a framework's own tool
    # validates its arguments and would refuse an unknown one.
    async def approve(bench: Bench) -> None:
        async def asked() -> bool:
            return "approval_required" in bench.kinds()

        await wait_until(asked, what="the approval request")
        approval_id = next(e.approval_required.approval_id for e in bench.events if e.HasField("approval_required"))
        decision = ApprovalDecision(approval_id=approval_id, action="approve")
        await bench.bus.request(subjects.run_control("r1"), Control(run_id="r1", approval=decision), ControlAck)

    async with bench_with(Policy()) as bench:
        confirm = ToolPermissions({"reverse": ToolPermission.CONFIRM})
        result, _ = await asyncio.gather(bench.gateway(confirm).run_tool(call(framework)), approve(bench))
    assert result == "cba"
    assert framework.ran == ['{"text": "abc"}']
