"""`code_exec` as the model sees it: its descriptor, and one call turned into a reply and run events.

As the original: `language` (`bash|sh|shell` → bash, `python|python3|py` → python, anything else
or nothing → javascript) and `code`; the result is the JSON object `{exitCode, stdout, stderr,
truncated?, timedOut?, artifactCount?}` (the optional keys only when true or non-zero), plus our
`limit?` (what stopped the code) and `artifactsDropped?`. The reply's events: an `agent_step`
`{stepName: "code_exec", description: "Ran <lang> (exit N)", data: {language, exitCode,
artifacts, timedOut?}}`, then each artifact, images as inline markdown data-URI text, other files
as `content` frames.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from typing import Any, Final

from atmosphere.contracts.run.v1.run_pb2 import AgentStep, Content, RunEvent, TextDelta
from atmosphere.contracts.tool.v1.tool_pb2 import TOOL_KIND_EXECUTE, ToolCall, ToolDescriptor, ToolReply
from atmosphere.sandbox import metrics
from atmosphere.sandbox.code.results import ExecResult, Language, SessionUnavailableError
from atmosphere.sandbox.code.sessions import CodeSessions
from atmosphere.sandbox.code.settings import CodeSettings

log = logging.getLogger("atmosphere.sandbox.code")

CODE_EXEC_TOOL: Final = "code_exec"
TIMEOUT_MARGIN_SECONDS: Final = 15.0
"""Added to the exec timeout in the descriptor: starting the sandbox, killing and cleaning up, artifacts."""
UNAVAILABLE: Final = "Error: Code execution is not available for this session."
ALL_LANGUAGES: Final[tuple[Language, ...]] = ("bash", "python", "javascript")
_ALIASES: Final[dict[str, Language]] = {
    "bash": "bash", "sh": "bash", "shell": "bash", "python": "python", "python3": "python", "py": "python",
}  # fmt: skip
_INTERPRETER: Final[dict[Language, str]] = {"bash": "bash", "python": "python3", "javascript": "node"}


def language_of(value: object) -> Language:
    """The language a `language` argument names (the original's mapping; javascript by default)."""
    return _ALIASES.get(value.strip().lower(), "javascript") if isinstance(value, str) else "javascript"


def code_exec_descriptor(settings: CodeSettings, languages: tuple[Language, ...] = ALL_LANGUAGES) -> ToolDescriptor:
    """The `code_exec` tool, for `ATMO_TOOLS` (the languages: what this host's sandboxes run)."""
    names = ", ".join(languages)
    schema = {
        "type": "object",
        "properties": {
            "language": {
                "type": "string",
                "description": f"The language of the code: one of {names} (sh and py are accepted too).",
            },
            "code": {"type": "string", "description": "The program to run, whole."},
        },
        "required": ["language", "code"],
    }
    description = (
        f"Run a program ({names}) in an isolated sandbox without network access and get back its "
        "exitCode, stdout and stderr. Files in the working directory /workspace stay for the "
        "next calls of this conversation's run; files written to /workspace/artifacts are handed "
        f"to the user (images shown) and then removed. Each call may run {settings.exec_timeout_seconds:g}s "
        f"and print {settings.max_output_bytes} bytes per stream; past either it is stopped."
    )
    timeout = settings.exec_timeout_seconds + TIMEOUT_MARGIN_SECONDS
    if settings.setup.strip():
        timeout += settings.exec_timeout_seconds  # the first call of a run also runs the setup command
    return ToolDescriptor(
        name=CODE_EXEC_TOOL,
        description=description,
        parameters_json_schema=json.dumps(schema),
        kind=TOOL_KIND_EXECUTE,
        timeout_seconds=timeout,
        provider="sandbox",
    )


def _failure(call: ToolCall, message: str) -> ToolReply:
    return ToolReply(call_id=call.call_id, content=message, is_error=True)


async def run_code_exec(sessions: CodeSessions, call: ToolCall) -> ToolReply:
    """Answer one `code_exec` call: bad arguments and an unavailable sandbox are `Error: ...` replies."""
    started = time.perf_counter()
    reply, result = await _code_exec(sessions, call)
    if result is None:
        metrics.executed(CODE_EXEC_TOOL, "error", started)
        return reply
    # The code's own failure (a non-zero exit) is an error; a limit the sandbox enforced is a kill.
    stopped_by = "timeout" if result.timed_out else result.limit
    if stopped_by is None:
        outcome = "ok" if result.exit_code == 0 else "error"
    else:
        metrics.killed(CODE_EXEC_TOOL, stopped_by)
        outcome = "timeout" if stopped_by == "timeout" else "killed"
    metrics.executed(CODE_EXEC_TOOL, outcome, started)
    return reply


async def _code_exec(sessions: CodeSessions, call: ToolCall) -> tuple[ToolReply, ExecResult | None]:
    """The reply to one call, and what the code came to (None: it did not run)."""
    try:
        arguments = json.loads(call.arguments_json or "{}")
    except (ValueError, RecursionError):
        return _failure(call, "Error: the arguments are not valid JSON"), None
    if not isinstance(arguments, dict):
        return _failure(call, "Error: the arguments must be a JSON object"), None
    code = arguments.get("code")
    if not isinstance(code, str) or not code.strip():
        return _failure(call, "Error: code is required: the program to run, as a string"), None
    language = language_of(arguments.get("language"))
    available = sessions.languages()
    if language not in available:
        others = ", ".join(available) or "none"
        missing = f"Error: {language} is not available here ({_INTERPRETER[language]} is not installed); use {others}"
        return _failure(call, missing), None
    # A call outside a run gets a sandbox of its own, gone after the call.
    session_id = call.run_id or f"call-{call.call_id}"
    try:
        result = await sessions.exec(session_id, language, code)
    except SessionUnavailableError as exc:
        return _failure(call, f"{UNAVAILABLE} {exc}".strip()), None
    finally:
        if not call.run_id:
            await sessions.release(session_id)
    reply = ToolReply(call_id=call.call_id, content=result_content(result), events=result_events(language, result))
    return reply, result


def result_content(result: ExecResult) -> str:
    """The JSON text the model reads: `{exitCode, stdout, stderr}` and the keys that apply."""
    content: dict[str, Any] = {"exitCode": result.exit_code, "stdout": result.stdout, "stderr": result.stderr}
    if result.truncated:
        content["truncated"] = True
    if result.timed_out:
        content["timedOut"] = True
    if result.limit is not None:
        content["limit"] = result.limit
    if result.artifacts:
        content["artifactCount"] = len(result.artifacts)
    if result.artifacts_dropped:
        content["artifactsDropped"] = result.artifacts_dropped
    return json.dumps(content, ensure_ascii=False)


def result_events(language: Language, result: ExecResult) -> list[RunEvent]:
    """The agent step, then each artifact: images as inline data-URI markdown, other files as content."""
    data: dict[str, Any] = {
        "language": language,
        "exitCode": result.exit_code,
        "artifacts": [artifact.name for artifact in result.artifacts],
    }
    if result.timed_out:
        data["timedOut"] = True
    step = AgentStep(
        step_name=CODE_EXEC_TOOL, description=f"Ran {language} (exit {result.exit_code})", data_json=json.dumps(data)
    )
    events = [RunEvent(agent_step=step)]
    for artifact in result.artifacts:
        if artifact.is_image:
            encoded = base64.b64encode(artifact.data).decode("ascii")
            text = f"![{artifact.name}](data:{artifact.mime_type};base64,{encoded})"
            events.append(RunEvent(text_delta=TextDelta(text=text)))
        else:
            file = Content(
                content_type="file", mime_type=artifact.mime_type, data=artifact.data, file_name=artifact.name
            )
            events.append(RunEvent(content=file))
    return events
