"""Every text the model gets instead of a tool's result: refusals, failures, what was withheld.

The texts are the model's (and the client's, in `tool-error` frames) only view of why a call
did not run or did not answer, so they say what happened and what the model may do about it.
The JSON ones are Atmosphere's exact texts (`{"status": "cancelled", ...}`, `{"error":
"tool_timeout", ...}`): models and clients written against it read them. Plain ones start with
`Error: `. Keeping them here keeps their wording consistent and findable in one place.
"""

from __future__ import annotations

import json
from typing import Any

from atmosphere.bus import BusError, NoRespondersError, PayloadTooLargeError, RemoteError, RequestTimeoutError
from atmosphere.bus.errors import ReplyTooLargeError


def _text(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"))


def cancelled(message: str) -> str:
    """Atmosphere's `{"status":"cancelled", ...}` text: the call was not run, on someone's say."""
    return _text({"status": "cancelled", "message": message})


CANCELLED_BY_USER = cancelled("Action cancelled by user")
"""What the model gets for a denied approval (Atmosphere's text)."""
APPROVAL_TIMED_OUT = _text({"status": "timeout", "message": "Approval timed out"})
"""Nobody decided the approval in time."""
INSUFFICIENT_AUTHORIZATION = cancelled("Tool execution denied: insufficient authorization")
"""What the model gets when the caller lacks a role the tool requires (Atmosphere's text)."""
INTERRUPTED = (
    "Error: the tool call {name} was interrupted: the worker running it stopped before it reported a result,"
    " so it may or may not have taken effect. It was not run again; check before repeating it."
)
"""What the model gets for a non-idempotent call that was under way when its worker died."""
ERROR_PREFIX = "Error: "
"""How a tool result the model gets says the call failed (the seed's `Error: ...` tool result)."""

NO_TOOL_RUNNER = "Error: no tool runner is attached to this run"
"""A runtime was asked for tools by the model on a run that cannot run any."""
TOOL_LIMIT_REACHED = "Error: the tool-call limit for this request was reached; answer with what you have"
"""The model asked for more tool calls than the run's tool loop allows."""
SCREEN_UNAVAILABLE = "Error: governance is unavailable, so the result of tool {tool} was withheld (fail-closed)"
SCREEN_NO_VERDICT = "Error: governance gave no verdict on the result of tool {tool}, so it was withheld (fail-closed)"


def unknown_tool(name: str) -> str:
    """The model asked for a tool the run does not have."""
    return _text({"error": "unknown_tool", "tool": name, "message": f"No tool named '{name}' is available"})


def invalid_arguments(name: str, problems: list[str]) -> str:
    """The arguments do not fit the tool's schema (or are no JSON object)."""
    return _text({"error": "invalid_arguments", "tool": name, "details": problems})


NOT_AN_OBJECT = "the arguments are not a JSON object"


def oversized_arguments(name: str, size: int, limit: int, *, approved: bool = False) -> str:
    """Arguments too large for one bus message (as asked, or as a reviewer approved them)."""
    which = "approved arguments" if approved else "arguments"
    return f"Error: the {which} of tool {name} are {size} bytes; the limit is {limit}"


def denied_by_mode(name: str) -> str:
    """The run's `PermissionMode.DENY_ALL` refused the call."""
    return cancelled(f"Tool {name} denied by PermissionMode.DENY_ALL")


def denied_by_configuration(name: str) -> str:
    """The operator's configured `deny` refused the call."""
    return cancelled(f"Tool {name} denied by ToolPermissionPolicy")


def denied_by_policy(name: str, policy: str, reason: str) -> str:
    """A governance policy refused the call."""
    return cancelled(f"Tool {name} denied by policy '{policy or 'default'}': {reason}")


def governance_check_too_large(name: str, exc: PayloadTooLargeError) -> str:
    """The call could not be sent to governance's check: refused (fail-closed)."""
    return (
        f"Error: the tool call {name} is too large for the governance check ({exc.size} bytes; the"
        f" limit is {exc.limit}), so it was refused (fail-closed)"
    )


def governance_could_not_check(name: str, exc: RemoteError) -> str:
    """Governance answered with an error instead of a decision."""
    return f"Error: governance could not check the tool call {name} ({exc.message}), so it was refused"


def governance_unavailable(name: str) -> str:
    """Governance did not answer the check: refused (fail-closed)."""
    return f"Error: governance is unavailable, so the tool call {name} was refused (fail-closed)"


def approval_asked_again(name: str) -> str:
    """A tool raised `ApprovalRequired` on the call that was already approved."""
    return f"Error: {name} asked for approval again after it was approved"


def local_timed_out(name: str, timeout: float) -> str:
    """An in-process tool (delegation) did not finish within its deadline."""
    return f"Error: {name} did not finish within {timeout:g}s"


def local_failed(name: str, why: str) -> str:
    """An in-process tool (delegation) raised."""
    return f"Error: {name} failed ({why})"


def stored_result_unreadable(name: str, exc: BusError) -> str:
    """A result the sandbox stored as an object could not be read back."""
    return f"Error: the result of tool {name} was too large for one message and could not be read back ({exc})"


def size_failure(name: str, exc: BusError) -> str | None:
    """What the model learns when a call or its result was too large for the bus; None otherwise."""
    if isinstance(exc, PayloadTooLargeError):
        return f"Error: the call to tool {name} is {exc.size} bytes; the limit is {exc.limit}"
    if isinstance(exc, RemoteError) and isinstance(exc.error, ReplyTooLargeError):
        size, limit = exc.details.get("size", "?"), exc.details.get("limit", "?")
        return f"Error: the result of tool {name} was too large to send ({size} bytes; the limit is {limit})"
    return None


def _not_served(name: str, *, memory_tool: bool, mcp_server: str) -> str:
    """Nobody subscribes to the call's subject."""
    if memory_tool:
        return f"Error: the memory service is not serving {name} right now"
    if mcp_server:
        return f"Error: no sandbox is connected to the MCP server '{mcp_server}' right now; {name} did not run"
    return f"Error: no sandbox serves the tool {name} right now"


def delivery_failure(name: str, timeout: float, exc: BusError, *, memory_tool: bool, mcp_server: str = "") -> str:
    """What the model learns when the bus could not deliver a tool call (`timeout`: the tool's deadline).

    `mcp_server`: the call is of that MCP server's tool (a sandbox holds its session).
    """
    if isinstance(exc, RequestTimeoutError):
        seconds = int(timeout) if timeout == int(timeout) else timeout
        return _text(
            {
                "error": "tool_timeout",
                "tool": name,
                "timeoutSeconds": seconds,
                "message": f"Tool execution exceeded the {seconds}s deadline and was cancelled",
            }
        )
    too_large = size_failure(name, exc)
    if too_large is not None:
        return too_large
    if isinstance(exc, NoRespondersError):
        return _not_served(name, memory_tool=memory_tool, mcp_server=mcp_server)
    if isinstance(exc, RemoteError):
        return f"Error: {exc.message}"
    return f"Error: the tool call failed ({exc})"
