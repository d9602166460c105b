"""Only a run's owner may cancel it or answer its approvals, checked again by the worker."""

from __future__ import annotations

import asyncio

import pytest

from atmosphere.bus import Headers, MessageContext, subjects
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.run.v1.run_pb2 import ApprovalDecision, Cancel, Control, ControlAck, RunSubmission
from atmosphere.dispatch.control import NOT_THE_OWNER, RunControl
from atmosphere.dispatch.settings import DispatchSettings
from atmosphere.sdk import App, agent
from atmosphere.testing import Turn, wait_until

from .conftest import Harness

CTX = MessageContext(subject="atmo.run.r1.ctl", headers=Headers())
ADA = Principal(user_id="ada", auth_method="bearer")
BOB = Principal(user_id="bob", auth_method="bearer")


def cancel(principal: Principal | None) -> Control:
    return Control(run_id="r1", cancel=Cancel(reason="stop"), principal=principal)


def approve(principal: Principal | None) -> Control:
    return Control(
        run_id="r1", approval=ApprovalDecision(approval_id="apr_0123456789ab", action="approve"), principal=principal
    )


@pytest.mark.parametrize("intruder", [BOB, None, Principal(auth_method="anonymous")])
async def test_someone_elses_cancel_is_refused_without_saying_why(intruder: Principal | None) -> None:
    control = RunControl("r1", owner="ada")
    ack = await control.handle(cancel(intruder), CTX)
    assert (ack.accepted, ack.detail) == (False, NOT_THE_OWNER)
    assert not control.cancelled
    assert (await control.handle(cancel(ADA), CTX)).accepted
    assert control.cancelled


async def test_someone_elses_approval_leaves_the_tool_waiting() -> None:
    control = RunControl("r1", owner="ada")
    pending = control.expect_approval("apr_0123456789ab")
    assert not (await control.handle(approve(BOB), CTX)).accepted
    assert not pending.done()
    assert (await control.handle(approve(ADA), CTX)).accepted
    assert pending.result().action == "approve"


@pytest.mark.parametrize("caller", [BOB, None])
async def test_a_run_without_an_owner_takes_control_from_anyone(caller: Principal | None) -> None:
    control = RunControl("r1")
    assert (await control.handle(cancel(caller), CTX)).accepted


@agent(name="talker", system_prompt="Talk.")
class Talker:
    """Talks."""


async def test_the_executor_makes_the_requesting_user_the_owner(harness: Harness) -> None:
    harness.provider.script(Turn.stalled("Thinking", seconds=30))
    request = RunSubmission(
        run_id="r1", session_id="s1", conversation_id="c1", agent="talker", message="hi", principal=ADA
    )
    run = asyncio.create_task(harness.executor(App(agents=[Talker])).execute(request))

    async def streaming() -> bool:
        return any(e.WhichOneof("kind") == "text_delta" for e in harness.events())

    await wait_until(streaming)
    refused = await harness.bus.request(subjects.run_control("r1"), cancel(BOB), ControlAck)
    assert not refused.accepted
    assert not run.done()
    assert (await harness.bus.request(subjects.run_control("r1"), cancel(ADA), ControlAck)).accepted
    await asyncio.wait_for(run, 5)
    last = harness.events()[-1]
    assert (last.error.code, last.owner) == ("run.cancelled", "ada")


def test_dispatch_reads_the_agent_endpoints_grants(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATMOSPHERE_INGRESS__AUTH_TOKENS", '[{"token": "token-ada-123", "user_id": "ada"}]')
    monkeypatch.setenv("ATMOSPHERE_INGRESS__PORT", "9999")  # ingress's own settings are no concern of dispatch
    grants = DispatchSettings().ingress.auth_tokens
    assert [(g.user_id, g.paths) for g in grants] == [("ada", ("*",))]
