"""`code_exec` as the model sees it: descriptor, arguments, result JSON and the run events."""

from __future__ import annotations

import base64
import json

import pytest

from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolKind
from atmosphere.sandbox.code import CODE_EXEC_TOOL, CodeSessions, CodeSettings, ExecResult, code_exec_descriptor
from atmosphere.sandbox.code.tool import language_of, result_content, run_code_exec

from .fakes import PNG, FakeBackend, image_and_file


def call(arguments: object, run_id: str = "run-1") -> ToolCall:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ToolCall(call_id="c1", name=CODE_EXEC_TOOL, arguments_json=text, run_id=run_id)


def test_the_descriptor_matches_the_original() -> None:
    descriptor = code_exec_descriptor(CodeSettings(exec_timeout_seconds=20))
    schema = json.loads(descriptor.parameters_json_schema)
    assert (descriptor.name, descriptor.provider, descriptor.kind) == (
        "code_exec",
        "sandbox",
        ToolKind.TOOL_KIND_EXECUTE,
    )
    assert schema["required"] == ["language", "code"]
    assert set(schema["properties"]) == {"language", "code"}
    assert descriptor.timeout_seconds == 35
    assert code_exec_descriptor(CodeSettings(exec_timeout_seconds=20, setup="npm i")).timeout_seconds == 55
    assert "bash, python" in code_exec_descriptor(CodeSettings(), ("bash", "python")).description


@pytest.mark.parametrize(
    ("given", "language"),
    [("bash", "bash"), ("SH", "bash"), (" shell ", "bash"), ("python", "python"), ("python3", "python"),
     ("py", "python"), ("javascript", "javascript"), ("ruby", "javascript"), (None, "javascript"), (3, "javascript")],
)  # fmt: skip
def test_languages_map_as_in_the_original(given: object, language: str) -> None:
    assert language_of(given) == language


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ("{nope", "Error: the arguments are not valid JSON"),
        ("[1]", "Error: the arguments must be a JSON object"),
        ({"language": "python"}, "Error: code is required: the program to run, as a string"),
        ({"language": "python", "code": 3}, "Error: code is required: the program to run, as a string"),
        ({"language": "python", "code": "  "}, "Error: code is required: the program to run, as a string"),
    ],
)
async def test_bad_arguments_are_errors_for_the_model(arguments: object, message: str) -> None:
    backend = FakeBackend()
    reply = await run_code_exec(CodeSessions(backend, CodeSettings()), call(arguments))
    assert (reply.content, reply.is_error) == (message, True)
    assert backend.opened == []


async def test_a_language_the_host_lacks_is_a_clear_error() -> None:
    sessions = CodeSessions(FakeBackend(languages_=("bash", "python")), CodeSettings())
    reply = await run_code_exec(sessions, call({"language": "javascript", "code": "1"}))
    assert reply.is_error
    assert reply.content == "Error: javascript is not available here (node is not installed); use bash, python"


async def test_an_unavailable_session_says_so_and_why() -> None:
    sessions = CodeSessions(FakeBackend(fail_opens=1), CodeSettings())
    reply = await run_code_exec(sessions, call({"language": "py", "code": "1"}))
    assert reply.is_error
    assert reply.content == "Error: Code execution is not available for this session. the fake backend refused"


async def test_a_result_is_the_originals_json_with_its_events() -> None:
    result = ExecResult(exit_code=0, stdout="out\n", stderr="", artifacts=image_and_file())
    sessions = CodeSessions(FakeBackend(result=result), CodeSettings())
    reply = await run_code_exec(sessions, call({"language": "python", "code": "print('out')"}))
    assert not reply.is_error
    assert json.loads(reply.content) == {"exitCode": 0, "stdout": "out\n", "stderr": "", "artifactCount": 2}
    step, image, file = reply.events
    assert (step.agent_step.step_name, step.agent_step.description) == ("code_exec", "Ran python (exit 0)")
    assert json.loads(step.agent_step.data_json) == {
        "language": "python", "exitCode": 0, "artifacts": ["plot.png", "data.csv"],
    }  # fmt: skip
    assert image.text_delta.text == f"![plot.png](data:image/png;base64,{base64.b64encode(PNG).decode()})"
    assert (file.content.content_type, file.content.mime_type, file.content.file_name) == (
        "file",
        "text/csv",
        "data.csv",
    )
    assert file.content.data == b"a,b\n1,2\n"


def test_optional_keys_appear_only_when_they_apply() -> None:
    stopped = ExecResult(exit_code=137, stdout="", stderr="", truncated=True, timed_out=True, limit="timeout")
    assert json.loads(result_content(stopped)) == {
        "exitCode": 137, "stdout": "", "stderr": "", "truncated": True, "timedOut": True, "limit": "timeout",
    }  # fmt: skip
    dropped = ExecResult(exit_code=0, stdout="", stderr="", artifacts_dropped=3)
    assert json.loads(result_content(dropped))["artifactsDropped"] == 3


async def test_a_call_outside_a_run_gets_a_sandbox_for_that_call_only() -> None:
    backend = FakeBackend()
    sessions = CodeSessions(backend, CodeSettings())
    reply = await run_code_exec(sessions, call({"language": "bash", "code": "echo"}, run_id=""))
    assert not reply.is_error
    assert [s.session_id for s in backend.opened] == ["call-c1"]
    assert backend.opened[0].closed
    assert len(sessions) == 0
