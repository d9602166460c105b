"""A run of exactly one tool call and no model: how a door's direct call of an app's `@tool` runs.

A submission whose metadata holds `TOOL_CALL_METADATA_KEY` (`{"name": <tool>, "arguments":
{...}}`, set by the MCP door for an app tool it exposes) is a run like any other — its owner,
admission, budgets, cancellation, tape — whose one step, instead of the agent's `@prompt`, is that
call through the tool choke point (`ToolGateway.run_call`: validation, governance's
`call_tool:<name>`, roles, permission mode and approval, journal, screen, offload, frames). The
run completes with the result as its text, or ends with `tool.failed` and the text a model would
have got. Only the agent's own `@tool`s may be called so (not its harness's, not the sandbox's
`code_exec`): anything else ends with `dispatch.tool_call_refused` and nothing runs.

Admission sees the call as the run's message; a policy that rewrites it (PII redaction) refuses
the call, since the tool would get the arguments as sent, not as the policy rewrote them.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Collection
from dataclasses import dataclass

from atmosphere.bus.errors import ToolCallFailedError, ToolCallRefusedError
from atmosphere.bus.runs import TOOL_CALL_METADATA_KEY
from atmosphere.contracts.governance.v1.governance_pb2 import Decision
from atmosphere.contracts.run.v1.run_pb2 import Complete, RunEvent, RunSubmission, TextDelta
from atmosphere.dispatch.budget import budget_breach
from atmosphere.dispatch.durability import Durability
from atmosphere.dispatch.event_output import EventOutput
from atmosphere.dispatch.run_scope import RunScope
from atmosphere.dispatch.tool_errors import ERROR_PREFIX
from atmosphere.dispatch.tools import ToolGateway, ToolOutcome
from atmosphere.sdk.host import BudgetReason
from atmosphere.sdk.runtime import ToolCallRequest

__all__ = ["DirectCall", "call_directly", "is_direct_call", "outcome_error", "requested_call", "rewrite_refusal"]


@dataclass(frozen=True, slots=True)
class DirectCall:
    """The one call a run asks for."""

    name: str
    arguments_json: str
    """The arguments object as JSON text (validated against the tool's schema by the choke point)."""

    def request(self, run_id: str) -> ToolCallRequest:
        """The call as the choke point takes it, its id the run's (the same on every delivery of the run)."""
        return ToolCallRequest(call_id=f"call_{run_id}", name=self.name, arguments_json=self.arguments_json)


def is_direct_call(request: RunSubmission) -> bool:
    """Whether `request` asks for one tool call instead of the agent's prompt."""
    return TOOL_CALL_METADATA_KEY in request.metadata


def requested_call(request: RunSubmission, own_tools: Collection[str]) -> DirectCall:
    """The call `request` asks for, of one of `own_tools`; a `ToolCallRefusedError` says why not."""
    raw = request.metadata.get(TOOL_CALL_METADATA_KEY, "")
    try:
        asked = json.loads(raw)
    except ValueError:
        asked = None
    if not isinstance(asked, dict) or not isinstance(asked.get("name"), str):
        msg = "The tool call asked for is unreadable: it needs a tool name and an arguments object"
        raise ToolCallRefusedError(msg)
    name: str = asked["name"]
    arguments = asked.get("arguments", {})
    if not isinstance(arguments, dict):
        msg = f"The arguments of the tool '{name[:128]}' must be a JSON object"
        raise ToolCallRefusedError(msg)
    if name not in own_tools:
        msg = f"The agent '{request.agent}' has no tool '{name[:128]}' that may be called directly"
        raise ToolCallRefusedError(msg)
    return DirectCall(name, json.dumps(arguments, ensure_ascii=False))


def outcome_error(outcome: ToolOutcome) -> ToolCallFailedError:
    """The error a run ends with when its one call had no result: the model's text, in plain words.

    Atmosphere's JSON texts (`{"status": "cancelled", "message": ...}`, `{"error":
    "invalid_arguments", "details": [...]}`) become their message; a plain one loses its `Error: `.
    """
    text = outcome.text.removeprefix(ERROR_PREFIX)
    return ToolCallFailedError(_plain(text) or "The tool call failed")


def _plain(text: str) -> str:
    try:
        said = json.loads(text) if text.startswith("{") else None
    except ValueError:
        said = None
    if not isinstance(said, dict):
        return text
    details = said.get("details")
    if said.get("error") == "invalid_arguments" and isinstance(details, list):
        return f"Invalid arguments for the tool '{said.get('tool', '')}': " + "; ".join(str(d) for d in details)
    message = said.get("message")
    return message if isinstance(message, str) and message else text


def rewrite_refusal(request: RunSubmission, decision: Decision) -> ToolCallRefusedError | None:
    """The refusal of a direct call whose input admission rewrote (None: not one, or not rewritten).

    The tool would get the arguments as sent, not as the policy rewrote them: fail-closed.
    """
    rewritten = decision.rewritten_message
    if not is_direct_call(request) or not rewritten or rewritten == request.message:
        return None
    return ToolCallRefusedError(
        f"A policy ('{decision.policy or 'default'}') rewrote this tool call's input; a direct tool call runs "
        "only with its arguments as sent, so it was refused"
    )


async def call_directly(scope: RunScope, gateway: ToolGateway, output: EventOutput, durability: Durability) -> None:
    """Run the one call `scope`'s request asks for through `gateway`, and end the run with its outcome.

    Within the budget's wall clock, like a model exchange.
    """
    try:
        call = requested_call(scope.request, {tool.name for tool in scope.spec.tools})
    except ToolCallRefusedError as refused:
        await output.fail(refused)
        return
    budget = scope.spec.budget
    deadline = budget.max_wall_clock if budget is not None and budget.max_wall_clock else 0.0
    started = time.monotonic()
    try:
        async with asyncio.timeout(deadline if deadline > 0 else None):
            outcome = await gateway.run_call(call.request(scope.request.run_id))
    except TimeoutError:  # only the budget's deadline times the call out (a tool's own is its error)
        elapsed_ms = round((time.monotonic() - started) * 1000)
        await output.trip(budget_breach(BudgetReason.WALL_CLOCK, elapsed_ms, deadline * 1000))
        return
    if durability.lost:
        return  # another worker took the run over: the rest is that worker's to say
    if outcome.is_error:
        await output.fail(outcome_error(outcome))
        return
    if outcome.text:
        await output.emit(RunEvent(text_delta=TextDelta(text=outcome.text)))
    await output.emit(RunEvent(complete=Complete(finish_reason="stop")))
