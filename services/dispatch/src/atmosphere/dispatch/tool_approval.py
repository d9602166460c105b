"""The approve stage of the tool choke point: a human decides, within the approval timeout.

The run emits `approval-required` and waits for the decision on its control subject. Approved:
the call runs with the arguments as asked or as the reviewer edited them. Denied, timed out, or
edited into unusable arguments: `CallFailed` (a `tool-error` after the call's `tool-start`). A
reviewer's `respond` stands in for the tool's answer: `CallAnswered`. A durable run journals
each decision, so a resumed run does not ask again what was decided, and asks again under the
same id what was not (an answer to the first asking still counts).
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from atmosphere.bus.sizes import utf8_len
from atmosphere.contracts.run.v1.run_pb2 import ApprovalRequired, RunEvent
from atmosphere.dispatch import tool_errors
from atmosphere.dispatch.control import RunControl
from atmosphere.dispatch.effects import RunEffects
from atmosphere.dispatch.tool_arguments import approved_arguments, check_size
from atmosphere.dispatch.tool_stops import CallAnswered, CallFailed
from atmosphere.sdk.runtime import ToolCallRequest


@dataclass(frozen=True)
class Approvals:
    """The approvals of one run's tool calls."""

    run_id: str
    control: RunControl
    emit: Callable[[RunEvent], Awaitable[None]]
    timeout: float
    effects: RunEffects | None
    data_limit: int
    """The most bytes of (approved) arguments one call carries."""

    async def approved(self, call: ToolCallRequest, arguments: dict[str, Any], *, message: str = "") -> dict[str, Any]:
        """The arguments as approved (possibly edited); raises `CallFailed` or `CallAnswered` instead."""
        outcome = await self._decision(call, arguments, message=message)
        check_size(self.run_id, call.name, utf8_len(json.dumps(outcome)), self.data_limit, approved=True)
        return outcome

    async def _decision(self, call: ToolCallRequest, arguments: dict[str, Any], *, message: str) -> dict[str, Any]:
        approval = self.effects.approval(call.name, arguments) if self.effects is not None else None
        if approval is not None:
            decided = approval.decided
            if decided is not None:  # decided before the worker died: not asked again
                return _decided(arguments, str(decided["action"]), str(decided["payload"]))
            await approval.ask()
        # A durable run asks again under the same id, so an answer to the first asking still counts.
        approval_id = "apr_" + (approval.key[:12] if approval is not None else secrets.token_hex(6))
        decision_future = self.control.expect_approval(approval_id)
        await self.emit(
            RunEvent(
                approval_required=ApprovalRequired(
                    approval_id=approval_id,
                    call_id=call.call_id,
                    tool_name=call.name,
                    arguments_json=json.dumps(arguments),
                    message=message or f"Allow {call.name} to run with these arguments?",
                    expires_in_seconds=int(self.timeout),
                )
            )
        )
        try:
            decision = await asyncio.wait_for(decision_future, self.timeout)
        except TimeoutError:
            if approval is not None:
                await approval.expire()
            raise CallFailed(tool_errors.APPROVAL_TIMED_OUT) from None
        if approval is not None:
            await approval.decide(decision.action, decision.payload_json)
        return _decided(arguments, decision.action, decision.payload_json)


def _decided(arguments: dict[str, Any], action: str, payload_json: str) -> dict[str, Any]:
    """What a reviewer's decision makes of the call: the arguments to run it with, or its end raised."""
    if action in {"approve", "yes"}:
        edited = approved_arguments(payload_json, arguments)
        if edited is None:
            raise CallFailed(tool_errors.CANCELLED_BY_USER)
        return edited
    if action == "respond" and payload_json:
        # The reviewer's answer stands in for the tool's: the model and the client get it as the
        # result. It is the run owner's own text, not a tool's output: not screened.
        raise CallAnswered(payload_json)
    raise CallFailed(tool_errors.CANCELLED_BY_USER)
