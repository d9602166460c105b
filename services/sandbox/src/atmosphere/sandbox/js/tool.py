"""The `eval` tool: its descriptor, and one call of it answered from an `EvalPool`."""

from __future__ import annotations

import json
import math
import time
from typing import Final

from atmosphere.bus.text import replace_lone_surrogates
from atmosphere.contracts.tool.v1.tool_pb2 import TOOL_KIND_EXECUTE, ToolCall, ToolDescriptor, ToolReply
from atmosphere.sandbox import metrics
from atmosphere.sandbox.js.pool import EvalPool, longest_call_seconds
from atmosphere.sandbox.js.settings import EvalSettings

EVAL_TOOL: Final = "eval"
TRUNCATION_MARKER: Final = "\n…(output truncated)"
"""Ends a value cut to `max_output_chars` (the original's marker, exactly)."""
TIMEOUT_MARGIN: Final = 1.0
"""Seconds the descriptor's timeout adds to the longest evaluation, for the reply to travel."""
_OUTCOMES: Final = {"result": "ok", "timeout": "timeout", "oom": "killed", "stopped": "killed"}
"""An evaluation's outcome as `atmosphere_sandbox_executions_total` names it (the others: `error`)."""
_STOPPED_BY: Final = {"timeout": "timeout", "oom": "memory", "stopped": "crashed"}
"""Evaluations V8 or the pool stopped, by reason (`stopped`: the worker died or broke the protocol)."""

_PARAMETERS: Final = {
    "type": "object",
    "properties": {
        "code": {
            "type": "string",
            "description": "JavaScript source; the value of its last expression is returned.",
        }
    },
    "required": ["code"],
    "additionalProperties": False,
}


def eval_descriptor(settings: EvalSettings) -> ToolDescriptor:
    """What sandbox publishes for `eval` under these settings."""
    return ToolDescriptor(
        name=EVAL_TOOL,
        description=(
            "Evaluate pure JavaScript (ECMAScript, V8) and return the value of its final expression: "
            "objects and arrays as JSON, `undefined` as undefined, strings as they are; a returned "
            "Promise is awaited. No I/O: no require, import, process, fetch, files or network. "
            f"Each call starts from a fresh global scope and may run {settings.timeout_millis} ms; "
            f"results longer than {settings.max_output_chars} characters are cut."
        ),
        parameters_json_schema=json.dumps(_PARAMETERS),
        kind=TOOL_KIND_EXECUTE,
        timeout_seconds=math.ceil(longest_call_seconds(settings) + TIMEOUT_MARGIN),
        provider="sandbox",
        # A pure function of its code: running it again changes nothing.
        idempotent=True,
    )


async def run_eval(pool: EvalPool, call: ToolCall) -> ToolReply:
    """Answer one `eval` call: the value as text, or an `Error: ...` (`is_error`)."""
    started = time.perf_counter()
    try:
        code = _code(call.arguments_json)
    except _BadArgumentsError as exc:
        metrics.executed(EVAL_TOOL, "error", started)
        return ToolReply(call_id=call.call_id, content=str(exc), is_error=True)
    outcome = await pool.evaluate(code)
    if stopped_by := _STOPPED_BY.get(outcome.kind):
        metrics.killed(EVAL_TOOL, stopped_by)
    metrics.executed(EVAL_TOOL, _OUTCOMES.get(outcome.kind, "error"), started)
    content = outcome.text + TRUNCATION_MARKER if outcome.truncated else outcome.text
    # V8 strings may hold lone surrogates, which a protobuf string cannot carry.
    return ToolReply(
        call_id=call.call_id,
        content=replace_lone_surrogates(content),
        is_error=outcome.is_error,
        truncated=outcome.truncated,
    )


class _BadArgumentsError(ValueError):
    """Arguments `eval` cannot run; the message is the model-facing `Error: ...`."""


_JSON_TYPES: Final = {bool: "a boolean", int: "a number", float: "a number", list: "an array", dict: "an object"}


def _code(arguments_json: str) -> str:
    """The call's `code`; `_BadArgumentsError` saying what is wrong with the arguments."""
    try:
        arguments = json.loads(arguments_json or "{}")
    except (ValueError, RecursionError):
        raise _BadArgumentsError("Error: the arguments are not valid JSON") from None
    if not isinstance(arguments, dict):
        raise _BadArgumentsError("Error: the arguments must be a JSON object")
    if unknown := sorted(set(arguments) - {"code"}):
        raise _BadArgumentsError(f"Error: eval takes only `code`; unknown argument(s): {', '.join(unknown)}")
    code = arguments.get("code")
    if code is None:
        raise _BadArgumentsError("Error: eval needs `code`: the JavaScript to evaluate, as a string")
    if not isinstance(code, str):
        raise _BadArgumentsError(f"Error: `code` must be a string, not {_JSON_TYPES.get(type(code), 'that')}")
    if not code.strip():
        raise _BadArgumentsError("Error: `code` is empty")
    return code
