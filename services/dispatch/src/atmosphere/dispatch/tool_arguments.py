"""The validate stage of the tool choke point: a call's arguments, parsed, checked and sized.

Sizes: every call travels in one bus message, bounded by the broker's limit less room for the
envelope (`atmosphere.bus.sizes.data_budget`). Arguments over it are refused before anything is
sent (an `Error: the arguments of tool X are N bytes; the limit is M` result, never a failed
send reported as "governance is unavailable").
"""

from __future__ import annotations

import json
import logging
from typing import Any

from atmosphere.bus.sizes import utf8_len
from atmosphere.dispatch import tool_errors
from atmosphere.dispatch.schema import check_arguments
from atmosphere.dispatch.tool_stops import CallFailed, CallRefused
from atmosphere.sdk.runtime import ToolCallRequest, ToolSpec

log = logging.getLogger("atmosphere.dispatch")


def parse_arguments(raw: str) -> dict[str, Any] | None:
    """The arguments object, or None when they are not one (bad JSON, too deep, a number too long)."""
    try:
        arguments = json.loads(raw or "{}")
    except (ValueError, RecursionError):
        return None
    return arguments if isinstance(arguments, dict) else None


def check_size(run_id: str, tool: str, size: int, limit: int, *, approved: bool = False) -> None:
    """Raise `CallFailed` when arguments of `size` bytes exceed what one bus message carries."""
    if size <= limit:
        return
    which = "approved arguments" if approved else "arguments"
    log.warning("run %s: the %s of %s are %d bytes; refused", run_id, which, tool, size)
    raise CallFailed(tool_errors.oversized_arguments(tool, size, limit, approved=approved))


def checked_arguments(
    run_id: str, call: ToolCallRequest, spec: ToolSpec, *, limit: int, lenient: bool
) -> tuple[dict[str, Any], str]:
    """The arguments and their JSON text; `CallRefused` or `CallFailed` when they cannot be used.

    `lenient`: the harness's plan and file tools check their own arguments, leniently (a model's
    double-encoded `todos` is accepted) and with Atmosphere's exact error texts.
    """
    # Measured before parsing: a 10 MB argument is refused without being parsed or sent.
    check_size(run_id, call.name, utf8_len(call.arguments_json), limit)
    arguments = parse_arguments(call.arguments_json)
    if arguments is None:
        raise CallRefused(tool_errors.invalid_arguments(call.name, [tool_errors.NOT_AN_OBJECT]))
    problems = [] if lenient else check_arguments(spec.parameters, arguments)
    if problems:
        raise CallRefused(tool_errors.invalid_arguments(call.name, problems))
    encoded = json.dumps(arguments)
    check_size(run_id, call.name, utf8_len(encoded), limit)  # escapes can make the re-encoding longer
    return arguments, encoded


def approved_arguments(payload_json: str, arguments: dict[str, Any]) -> dict[str, Any] | None:
    """The arguments an approval lets run: as asked, or as the reviewer edited them; None when unusable."""
    if not payload_json:
        return arguments
    try:
        edited = json.loads(payload_json)
    except (ValueError, RecursionError):
        return None
    edited = edited.get("arguments", edited) if isinstance(edited, dict) else None
    return edited if isinstance(edited, dict) else None
