"""What one call of a `@tool` function comes to, the same wherever it runs.

The service process (in-process executor) and a tool worker (`atmosphere.sandbox.tool_worker`)
both run a call through `run_tool`, so a tool's result, its own signals (`ToolError`,
`ModelRetry`, `ApprovalRequired`), bad arguments, exceptions and timeouts become the same
`ToolOutcome` either way; `ToolHost` turns it into the `ToolReply`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, replace
from typing import Any, Literal

from atmosphere.bus.sizes import clip, utf8_len
from atmosphere.bus.text import replace_lone_surrogates
from atmosphere.sdk import ApprovalRequired, Tool
from atmosphere.sdk.host import ToolArgumentsError, ToolSignal

log = logging.getLogger("atmosphere.sandbox")

OutcomeKind = Literal["result", "error", "approval"]


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """One call's outcome: a result, an `Error: ...` text for the model, or a request for approval."""

    kind: OutcomeKind
    text: str
    """The result, the error text, or (for `approval`) the message the user reads."""
    truncated: bool = False
    """`text` was cut (it ends with the marker of `atmosphere.bus.sizes.clip`)."""
    timed_out: bool = False
    """The tool did not finish within its timeout (a sync one may still be running in its thread)."""
    killed: bool = False
    """The worker running the call ended under it (`worker_stops`): the call was not completed."""

    @classmethod
    def error(cls, text: str) -> ToolOutcome:
        """A failed call whose model-facing text is `text`."""
        return cls("error", replace_lone_surrogates(text))


@dataclass(frozen=True, slots=True)
class ResultLimits:
    """How large a call's text may be; what is larger is cut the way `ToolHost` cuts it."""

    inline_bytes: int
    """What one reply carries: an error, or any text up to this size, is passed on as is or cut to it."""
    result_bytes: int
    """The most a result larger than `inline_bytes` keeps (its object's size, or `inline_bytes` without one)."""

    def shape(self, outcome: ToolOutcome, tool: str) -> ToolOutcome:
        """`outcome` within these limits, cut with the marker naming `tool`'s result."""
        if outcome.kind == "approval" or utf8_len(outcome.text) <= self.inline_bytes:
            return outcome
        limit = self.inline_bytes if outcome.kind == "error" else self.result_bytes
        kept = clip(outcome.text, limit, f"the result of {tool}")
        return outcome if kept is outcome.text else replace(outcome, text=kept, truncated=True)


async def run_tool(
    tool: Tool[Any, Any], arguments: dict[str, Any], *, run_id: str = "", timeout: float | None = None
) -> ToolOutcome:
    """Run one call of `tool` within its timeout; every way it can end becomes a `ToolOutcome`.

    `timeout` is what is left of the tool's own when the call waited before it started (a worker
    taking it); the error still names the tool's timeout, the one its caller knows.
    """
    try:
        content = await asyncio.wait_for(tool.invoke(arguments), tool.timeout if timeout is None else timeout)
    except ToolArgumentsError as exc:
        return ToolOutcome.error(json.dumps({"error": "invalid_arguments", "tool": tool.name, "details": exc.details}))
    except TimeoutError:
        timed_out = ToolOutcome.error(f"Error: {tool.name} did not finish within {tool.timeout:g}s")
        return replace(timed_out, timed_out=True)
    except ApprovalRequired as exc:
        return ToolOutcome("approval", exc.message)
    except ToolSignal as exc:  # the tool's own words, meant for the model
        return ToolOutcome.error(exc.model_text())
    except Exception as exc:
        log.warning("tool %s failed on run %s", tool.name, run_id, exc_info=True)
        return ToolOutcome.error(f"Error: {str(exc) or type(exc).__name__}")
    return ToolOutcome("result", replace_lone_surrogates(content))


def parse_arguments(arguments_json: str) -> dict[str, Any] | ToolOutcome:
    """A call's arguments as a JSON object, or the error outcome saying why they are not one."""
    try:
        arguments = json.loads(arguments_json or "{}")
    except (ValueError, RecursionError):  # not JSON, nested too deep, or a number too long
        return ToolOutcome.error("Error: the arguments are not valid JSON")
    if not isinstance(arguments, dict):
        return ToolOutcome.error("Error: the arguments must be a JSON object")
    return arguments
