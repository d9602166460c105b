"""A tool's result always fits in one bus message; malformed arguments are an error result."""

from __future__ import annotations

import pytest

from atmosphere.bus import subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolResult
from atmosphere.sandbox.handlers import ENVELOPE_ROOM, ToolHost
from atmosphere.sdk import tool

LIMIT = 64 * 1024


@tool
def produce(size: int, char: str = "x") -> str:
    """A result of `size` characters."""
    return char * size


@tool
def surrogate() -> str:
    """A result protobuf cannot encode as is."""
    return "bad \ud800 text"


async def call(name: str, arguments: str) -> ToolResult:
    bus = FakeBus(max_payload=LIMIT)
    host = ToolHost({t.name: t for t in (produce, surrogate)}, max_payload=LIMIT)
    async with bus.serve(host.router()):
        request = ToolCall(call_id="c1", name=name, arguments_json=arguments)
        return await bus.request(subjects.tool(name), request, ToolResult)


@pytest.mark.parametrize("char", ["x", "é", "😀"])
async def test_a_result_over_the_limit_is_cut_with_a_marker(char: str) -> None:
    size = LIMIT + 1  # one character over the broker's whole limit
    result = await call("produce", f'{{"size": {size}, "char": "{char}"}}')
    assert not result.is_error
    assert result.truncated
    assert result.ByteSize() <= LIMIT - ENVELOPE_ROOM + 64
    whole = size * len(char.encode())
    kept = len(result.content.split("\n…[truncated")[0].encode())
    assert result.content.endswith(
        f"…[truncated: the result of produce is {whole} bytes; only the first {kept} bytes are kept]"
    )


async def test_a_result_within_the_limit_is_untouched() -> None:
    result = await call("produce", f'{{"size": {LIMIT - ENVELOPE_ROOM - 100}}}')
    assert not result.truncated
    assert result.content == "x" * (LIMIT - ENVELOPE_ROOM - 100)


async def test_a_lone_surrogate_in_a_result_is_replaced_not_a_failed_reply() -> None:
    result = await call("surrogate", "{}")
    assert result.content == "bad ? text"


@pytest.mark.parametrize(
    "arguments",
    ["[" * 20_000 + "]" * 20_000, '{"size": ' + "9" * 5000 + "}", "{", '"text"'],
    ids=["nested-20k", "5000-digits", "unterminated", "not-an-object"],
)
async def test_malformed_arguments_are_error_results(arguments: str) -> None:
    result = await call("produce", arguments)
    assert result.is_error
    assert result.content.startswith("Error: the arguments")
