"""Permission modes, configured tool permissions and required roles at the tool choke point (§11.3).

Order pinned here: governance → roles (no frames) → `tool-start` → mode → configured permission
→ approval → execution. Each refusal's text is Atmosphere's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

import pytest
from pydantic import ValidationError

from atmosphere.bus import JetStreamLayout, MessageContext, Router, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.run.v1.run_pb2 import (
    ApprovalDecision,
    ApprovalRequired,
    Control,
    ControlAck,
    RunEvent,
    RunSubmission,
)
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolReply
from atmosphere.dispatch.control import RunControl
from atmosphere.dispatch.descriptors import permissions_info
from atmosphere.dispatch.permissions import (
    ToolPermission,
    ToolPermissions,
    run_mode,
)
from atmosphere.dispatch.settings import DispatchSettings
from atmosphere.dispatch.tool_errors import INSUFFICIENT_AUTHORIZATION
from atmosphere.dispatch.tools import ToolGateway
from atmosphere.sdk import App, PermissionMode, ToolKind, agent, tool
from atmosphere.sdk.host import APPROVED_ARGUMENT
from atmosphere.sdk.runtime import ToolCallRequest, ToolSpec
from atmosphere.testing import ToolCallScript, Turn, wait_until

from .conftest import Harness, Policy, governance_router, kinds, request

SCHEMA = {"type": "object", "properties": {"note": {"type": "string"}}}
TOOLS = {
    "edit_note": ToolSpec("edit_note", "", SCHEMA, kind=ToolKind.EDIT, requires_approval=True),
    "read_note": ToolSpec("read_note", "", SCHEMA, kind=ToolKind.READ),
    "wire_money": ToolSpec("wire_money", "", SCHEMA, requires_approval=True),
    "delete_note": ToolSpec("delete_note", "", SCHEMA, kind=ToolKind.DELETE),
    "guarded": ToolSpec("guarded", "", SCHEMA, kind=ToolKind.EDIT),
}


def cancelled(message: str) -> str:
    return json.dumps({"status": "cancelled", "message": message}, separators=(",", ":"))


@dataclass
class Bench:
    """One run's tool gateway on the in-memory bus, with governance and a sandbox serving `TOOLS`."""

    bus: FakeBus
    policy: Policy
    calls: list[ToolCall] = field(default_factory=list)
    events: list[RunEvent] = field(default_factory=list)
    control: RunControl = field(default_factory=lambda: RunControl("r1"))

    async def emit(self, event: RunEvent) -> None:
        self.events.append(event)

    def gateway(
        self,
        mode: PermissionMode = PermissionMode.DEFAULT,
        *,
        permissions: Mapping[str, ToolPermission] | None = None,
        tool_roles: Mapping[str, tuple[str, ...]] | None = None,
        roles: tuple[str, ...] = (),
    ) -> ToolGateway:
        run = RunSubmission(run_id="r1", conversation_id="c1", agent="notes", principal=Principal(roles=roles))
        return ToolGateway(
            bus=self.bus,
            run=run,
            emit=self.emit,
            tools=TOOLS,
            control=self.control,
            approval_timeout=10,
            permission_mode=mode,
            permissions=ToolPermissions(dict(permissions or {})),
            tool_roles=tool_roles or {},
        )

    def kinds(self) -> list[str]:
        return [e.WhichOneof("kind") or "" for e in self.events]

    def approvals(self) -> list[ApprovalRequired]:
        return [e.approval_required for e in self.events if e.WhichOneof("kind") == "approval_required"]

    async def approve_when_asked(self, count: int = 1) -> None:
        """Approve the `count`-th approval request once it is asked (on the run's control subject)."""

        async def asked() -> bool:
            return len(self.approvals()) >= count

        await wait_until(asked, what="the approval request")
        decision = ApprovalDecision(approval_id=self.approvals()[count - 1].approval_id, action="approve")
        ack = await self.bus.request(subjects.run_control("r1"), Control(run_id="r1", approval=decision), ControlAck)
        assert ack.accepted


def sandbox(bench: Bench) -> Router:
    router = Router()
    for name in TOOLS:

        async def answer(call: ToolCall, _ctx: MessageContext, name: str = name) -> ToolReply:
            bench.calls.append(call)
            arguments = json.loads(call.arguments_json)
            if name == "guarded" and not arguments.get(APPROVED_ARGUMENT):
                # What the sandbox replies when the tool raised `ApprovalRequired`.
                asked = RunEvent(approval_required=ApprovalRequired(tool_name=name, message="Really?"))
                return ToolReply(call_id=call.call_id, events=[asked])
            return ToolReply(call_id=call.call_id, content=f"{name} ran")

        router.add(subjects.tool(name), ToolCall, answer)
    return router


@pytest.fixture
async def bench() -> AsyncIterator[Bench]:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    state = Bench(bus, Policy())
    async with bus.serve(governance_router(state.policy)), bus.serve(sandbox(state)), bus.serve(state.control.router()):
        yield state


def call(name: str, note: str = "groceries") -> ToolCallRequest:
    return ToolCallRequest(call_id=f"call-{name}", name=name, arguments_json=json.dumps({"note": note}))


async def run_approving(gateway: ToolGateway, bench: Bench, name: str) -> str:
    """Run one call, approving it if it asks (and failing the test if it hangs)."""
    approver = asyncio.create_task(bench.approve_when_asked())
    try:
        return await asyncio.wait_for(gateway.run_tool(call(name)), 10)
    finally:
        approver.cancel()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await approver


# -- permission modes ---------------------------------------------------------------------------


async def test_deny_all_refuses_after_tool_start_and_nothing_runs(bench: Bench) -> None:
    text = await bench.gateway(PermissionMode.DENY_ALL).run_tool(call("read_note"))
    assert text == cancelled("Tool read_note denied by PermissionMode.DENY_ALL")
    assert bench.kinds() == ["tool_start", "tool_error"]
    assert bench.events[-1].tool_error.error == text
    assert len(bench.policy.checks) == 1  # governance saw it first (§11.3's order)
    assert bench.calls == []


async def test_plan_asks_approval_even_for_a_tool_that_does_not_declare_it(bench: Bench) -> None:
    text = await run_approving(bench.gateway(PermissionMode.PLAN), bench, "read_note")
    assert text == "read_note ran"
    assert bench.kinds() == ["tool_start", "approval_required", "tool_result"]
    assert json.loads(bench.calls[0].arguments_json)[APPROVED_ARGUMENT] is True


async def test_default_runs_an_undeclared_tool_without_asking(bench: Bench) -> None:
    assert await bench.gateway().run_tool(call("read_note")) == "read_note ran"
    assert bench.kinds() == ["tool_start", "tool_result"]


async def test_default_asks_for_a_tool_that_declares_approval(bench: Bench) -> None:
    assert await run_approving(bench.gateway(), bench, "edit_note") == "edit_note ran"
    assert "approval_required" in bench.kinds()


async def test_accept_edits_runs_an_edit_tool_unasked_but_still_asks_for_others(bench: Bench) -> None:
    gateway = bench.gateway(PermissionMode.ACCEPT_EDITS)
    assert await gateway.run_tool(call("edit_note")) == "edit_note ran"
    assert bench.kinds() == ["tool_start", "tool_result"]
    assert await run_approving(gateway, bench, "wire_money") == "wire_money ran"
    assert bench.kinds()[2:] == ["tool_start", "approval_required", "tool_result"]


async def test_bypass_runs_a_tool_that_declares_approval_without_asking(bench: Bench) -> None:
    assert await bench.gateway(PermissionMode.BYPASS).run_tool(call("wire_money")) == "wire_money ran"
    assert bench.kinds() == ["tool_start", "tool_result"]


@pytest.mark.parametrize(
    ("mode", "asks"),
    [(PermissionMode.BYPASS, False), (PermissionMode.ACCEPT_EDITS, False), (PermissionMode.DEFAULT, True)],
)
async def test_a_tool_asking_for_approval_while_it_runs_follows_the_mode(
    bench: Bench, mode: PermissionMode, asks: bool
) -> None:
    text = await run_approving(bench.gateway(mode), bench, "guarded")
    assert text == "guarded ran"
    assert ("approval_required" in bench.kinds()) is asks
    assert len(bench.calls) == 2  # asked, then run again marked approved
    assert json.loads(bench.calls[1].arguments_json)[APPROVED_ARGUMENT] is True


# -- configured permissions ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", list(PermissionMode.__members__.values()))
async def test_a_configured_deny_refuses_in_every_mode(bench: Bench, mode: PermissionMode) -> None:
    text = await bench.gateway(mode, permissions={"delete_*": ToolPermission.DENY}).run_tool(call("delete_note"))
    expected = "PermissionMode.DENY_ALL" if mode is PermissionMode.DENY_ALL else "ToolPermissionPolicy"
    assert text == cancelled(f"Tool delete_note denied by {expected}")
    assert bench.kinds() == ["tool_start", "tool_error"]
    assert bench.calls == []


async def test_a_configured_confirm_asks_for_approval(bench: Bench) -> None:
    gateway = bench.gateway(permissions={"read_note": ToolPermission.CONFIRM})
    assert await run_approving(gateway, bench, "read_note") == "read_note ran"
    assert bench.kinds() == ["tool_start", "approval_required", "tool_result"]


def test_an_exact_name_beats_a_glob_and_deny_beats_confirm_among_globs() -> None:
    permissions = ToolPermissions(
        {"*_note": ToolPermission.CONFIRM, "delete_*": ToolPermission.DENY, "read_note": ToolPermission.CONFIRM}
    )
    assert permissions.of("delete_note") is ToolPermission.DENY
    assert permissions.of("edit_note") is ToolPermission.CONFIRM
    assert permissions.of("read_note") is ToolPermission.CONFIRM
    assert permissions.of("wire_money") is None
    assert ToolPermissions({"*": ToolPermission.DENY, "read_note": ToolPermission.CONFIRM}).of("read_note") == "confirm"


def test_permissions_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATMOSPHERE_TOOLS__PERMISSIONS", '{"delete_*": "deny", "send_email": "Confirm"}')
    policy = DispatchSettings().tools.policy
    assert dict(policy.rules) == {"delete_*": ToolPermission.DENY, "send_email": ToolPermission.CONFIRM}


@pytest.mark.parametrize(
    ("value", "named"),
    [('{"delete_*": "forbid"}', "delete_*"), ('{"x": true}', "'x'"), ('{" ": "deny"}', "key"), ('["deny"]', "")],
)
def test_an_invalid_permission_stops_startup_naming_the_key(
    monkeypatch: pytest.MonkeyPatch, value: str, named: str
) -> None:
    monkeypatch.setenv("ATMOSPHERE_TOOLS__PERMISSIONS", value)
    with pytest.raises(ValidationError, match=r"tools\.permissions") as raised:
        DispatchSettings()
    assert named in str(raised.value)


# -- roles --------------------------------------------------------------------------------------


async def test_a_caller_without_the_required_role_is_refused_before_tool_start(bench: Bench) -> None:
    gateway = bench.gateway(tool_roles={"delete_note": ("admin", "editor")}, roles=("editor",))
    text = await gateway.run_tool(call("delete_note"))
    assert text == INSUFFICIENT_AUTHORIZATION
    assert json.loads(text) == {"status": "cancelled", "message": "Tool execution denied: insufficient authorization"}
    assert bench.events == []  # no frames at all
    assert bench.calls == []
    assert len(bench.policy.checks) == 1  # after governance


async def test_a_caller_holding_every_required_role_runs_the_tool(bench: Bench) -> None:
    gateway = bench.gateway(tool_roles={"delete_note": ("admin", "editor")}, roles=("editor", "admin", "x"))
    assert await gateway.run_tool(call("delete_note")) == "delete_note ran"


async def test_a_governance_denial_comes_before_the_role_check(bench: Bench) -> None:
    bench.policy.tools = False
    text = await bench.gateway(tool_roles={"delete_note": ("admin",)}).run_tool(call("delete_note"))
    assert text == cancelled("Tool delete_note denied by policy 'test-policy': not allowed here")


# -- the run's mode: the agent's, or the request's stricter one ---------------------------------


def submission(**metadata: str) -> RunSubmission:
    return RunSubmission(run_id="r1", agent="notes", metadata=metadata)


@pytest.mark.parametrize(
    ("agent_mode", "metadata", "expected"),
    [
        (PermissionMode.DEFAULT, {}, PermissionMode.DEFAULT),
        (PermissionMode.DEFAULT, {"ai.permissionMode": "plan"}, PermissionMode.PLAN),
        (PermissionMode.DEFAULT, {"ai.permissionMode": "DENY_ALL"}, PermissionMode.DENY_ALL),
        (PermissionMode.BYPASS, {"ai.permissionMode": "accept-edits"}, PermissionMode.ACCEPT_EDITS),
        (PermissionMode.DEFAULT, {"hints.permissionMode": '"Plan"'}, PermissionMode.PLAN),
        (PermissionMode.PLAN, {"ai.permissionMode": "PermissionMode.DENY_ALL"}, PermissionMode.DENY_ALL),
    ],
)
def test_a_request_may_make_the_mode_stricter(
    agent_mode: PermissionMode, metadata: dict[str, str], expected: PermissionMode
) -> None:
    assert run_mode(agent_mode, submission(**metadata)) is expected


@pytest.mark.parametrize(
    ("agent_mode", "requested", "logged"),
    [
        (PermissionMode.DEFAULT, "bypass", "looser"),
        (PermissionMode.PLAN, "default", "looser"),
        (PermissionMode.DENY_ALL, "plan", "looser"),
        (PermissionMode.DEFAULT, "yolo", "not a permission mode"),
    ],
)
def test_a_looser_or_unknown_requested_mode_is_ignored_and_logged(
    caplog: pytest.LogCaptureFixture, agent_mode: PermissionMode, requested: str, logged: str
) -> None:
    with caplog.at_level(logging.WARNING, logger="atmosphere.dispatch"):
        assert run_mode(agent_mode, submission(**{"ai.permissionMode": requested})) is agent_mode
    assert logged in caplog.text


# -- through a whole run: the agent's declaration, the request's metadata, the principal --------


@tool(kind=ToolKind.EDIT, requires_approval=True)
def rename_note(note: str) -> str:
    """Rename a note (asks for approval)."""
    return "unused: the stand-in sandbox answers"


@tool(roles=("admin",))
def purge_notes(note: str) -> str:
    """Delete every note (admins only)."""
    return "unused"


@agent(name="editor", tools=[rename_note, purge_notes], harness=[], permission_mode=PermissionMode.ACCEPT_EDITS)
class Editor:
    """Edits notes without asking."""


APP = App(agents=[Editor])


async def test_an_agents_declared_mode_applies_to_its_runs(harness: Harness) -> None:
    await harness.serve_tools({"rename_note": "renamed"})
    harness.provider.script(Turn.tool_calls(ToolCallScript("rename_note", {"note": "a"})), Turn.text("done"))
    await harness.executor(APP).execute(request("editor"))
    assert kinds(harness.events()).count("approval_required") == 0  # ACCEPT_EDITS: an EDIT tool runs unasked
    assert [e.tool_result.result for e in harness.events() if e.WhichOneof("kind") == "tool_result"] == ["renamed"]


async def test_a_request_asking_deny_all_stops_every_tool_of_its_run(harness: Harness) -> None:
    await harness.serve_tools({"rename_note": "renamed"})
    harness.provider.script(Turn.tool_calls(ToolCallScript("rename_note", {"note": "a"})), Turn.text("done"))
    run = request("editor")
    run.metadata["ai.permissionMode"] = "deny_all"
    await harness.executor(APP).execute(run)
    assert harness.tool_calls == []
    refusal = cancelled("Tool rename_note denied by PermissionMode.DENY_ALL")
    assert harness.provider.requests[-1]["messages"][-1]["content"] == refusal


async def test_a_runs_principal_roles_decide_a_tool_with_roles(harness: Harness) -> None:
    await harness.serve_tools({"purge_notes": "purged"})
    script = [Turn.tool_calls(ToolCallScript("purge_notes", {"note": "a"})), Turn.text("done")]
    harness.provider.script(*script, *script)
    executor = harness.executor(APP)
    await executor.execute(request("editor", run_id="r1"))
    admin = request("editor", run_id="r2")
    admin.principal.roles.append("admin")
    await executor.execute(admin)
    contents = [r["messages"][-1]["content"] for r in harness.provider.requests[1::2]]
    assert contents == [INSUFFICIENT_AUTHORIZATION, "purged"]
    assert len(harness.tool_calls) == 1


# -- runtime truth --------------------------------------------------------------------------------


def test_the_info_lists_each_agents_mode_and_the_configured_permissions() -> None:
    @agent(name="plain", harness=[])
    class Plain:
        """Plain."""

    app = App(agents=[Editor, Plain])
    assert permissions_info(app, ToolPermissions()) == {
        "permissionModes": {"editor": "ACCEPT_EDITS", "plain": "DEFAULT"}
    }
    configured = permissions_info(app, ToolPermissions({"delete_*": ToolPermission.DENY}))
    assert configured["toolPermissions"] == {"delete_*": "deny"}
