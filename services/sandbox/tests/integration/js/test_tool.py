"""The `eval` tool: its descriptor, its arguments, and its replies (the original's texts)."""

from __future__ import annotations

import json

import pytest

from atmosphere.contracts.tool.v1.tool_pb2 import TOOL_KIND_EXECUTE, ToolCall
from atmosphere.sandbox.js.pool import EvalPool, longest_call_seconds
from atmosphere.sandbox.js.settings import EvalSettings
from atmosphere.sandbox.js.tool import EVAL_TOOL, TRUNCATION_MARKER, eval_descriptor, run_eval

from .conftest import OUTPUT_CHARS, SMALL

on_module_loop = pytest.mark.asyncio(loop_scope="module")
"""For the tests using `shared_pool`, which lives on the module's loop."""


def call(arguments: object) -> ToolCall:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ToolCall(call_id="c-1", name=EVAL_TOOL, arguments_json=text)


def test_the_descriptor_offers_pure_javascript_with_one_required_code_parameter() -> None:
    settings = EvalSettings(enabled=True)
    descriptor = eval_descriptor(settings)
    assert (descriptor.name, descriptor.provider, descriptor.kind) == ("eval", "sandbox", TOOL_KIND_EXECUTE)
    schema = json.loads(descriptor.parameters_json_schema)
    assert schema["required"] == ["code"]
    assert schema["properties"]["code"]["type"] == "string"
    assert "No I/O" in descriptor.description
    assert "final expression" in descriptor.description
    assert descriptor.timeout_seconds >= longest_call_seconds(settings) > settings.timeout_seconds
    assert descriptor.idempotent


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ("not json", "Error: the arguments are not valid JSON"),
        ([1], "Error: the arguments must be a JSON object"),
        ({}, "Error: eval needs `code`: the JavaScript to evaluate, as a string"),
        ({"code": 42}, "Error: `code` must be a string, not a number"),
        ({"code": ["1"]}, "Error: `code` must be a string, not an array"),
        ({"code": "  "}, "Error: `code` is empty"),
        ({"code": "1", "language": "python"}, "Error: eval takes only `code`; unknown argument(s): language"),
    ],
)
@on_module_loop
async def test_bad_arguments_are_a_clear_error_and_start_nothing(arguments: object, text: str) -> None:
    pool = EvalPool(SMALL)  # never started: bad arguments must not reach a worker
    reply = await run_eval(pool, call(arguments))
    assert (reply.call_id, reply.content, reply.is_error) == ("c-1", text, True)
    assert pool.worker_pids() == []


@on_module_loop
async def test_a_value_is_the_reply(shared_pool: EvalPool) -> None:
    reply = await run_eval(shared_pool, call({"code": "({sum: [1, 2, 3].reduce((a, b) => a + b)})"}))
    assert (reply.content, reply.is_error, reply.truncated) == ('{"sum":6}', False, False)


@on_module_loop
async def test_a_long_value_ends_with_the_originals_marker(shared_pool: EvalPool) -> None:
    reply = await run_eval(shared_pool, call({"code": "'z'.repeat(100000)"}))
    assert reply.content == "z" * OUTPUT_CHARS + "\n…(output truncated)"
    assert reply.content.endswith(TRUNCATION_MARKER)
    assert (reply.is_error, reply.truncated) == (False, True)


@pytest.mark.parametrize(
    ("code", "text"),
    [
        ("require('fs')", "Error: ReferenceError: require is not defined"),
        ("while (true) {}", "Error: eval timed out after 1000 ms"),
        (
            "const a = []; while (true) a.push(new Array(1 << 16).fill(0))",
            "Error: eval ran out of memory (limit 32 MiB)",
        ),
    ],
)
@on_module_loop
async def test_errors_are_the_originals_texts(shared_pool: EvalPool, code: str, text: str) -> None:
    reply = await run_eval(shared_pool, call({"code": code}))
    assert (reply.content, reply.is_error) == (text, True)


@on_module_loop
async def test_a_lone_surrogate_in_a_value_still_makes_a_valid_reply(shared_pool: EvalPool) -> None:
    reply = await run_eval(shared_pool, call({"code": "'a' + String.fromCharCode(0xd800) + 'b'"}))
    assert not reply.is_error
    assert reply.SerializeToString()  # a protobuf string must be valid UTF-8
    assert reply.content[0] == "a"
    assert reply.content[-1] == "b"
