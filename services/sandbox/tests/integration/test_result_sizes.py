"""A tool's result travels whole: inline when one message carries it, else as a stored object.

Only a result over `max_result_bytes`, or one that cannot be stored, is cut (with a marker that
says so and how large it was). Malformed arguments are an error result. Each test runs with
the tools in-process and in a tool worker (`executor`), which cuts a result itself before it
sends it: the replies are the same.
"""

from __future__ import annotations

import json

import pytest

from atmosphere.bus import JetStreamLayout, subjects
from atmosphere.bus.sizes import ENVELOPE_ROOM
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolReply
from atmosphere.sandbox.handlers import DEFAULT_MAX_RESULT_BYTES, ToolExecutor, ToolHost
from atmosphere.sdk import tool

pytestmark = pytest.mark.asyncio(loop_scope="module")  # one tool worker for the module (`executor`)

LIMIT = 64 * 1024
INLINE = LIMIT - ENVELOPE_ROOM
"""The most bytes of content a reply carries under this broker limit."""


@tool
def produce(size: int, char: str = "x") -> str:
    """A result of `size` characters."""
    return char * size


@tool
def fail_loudly(size: int) -> str:
    """Fails with a very long message."""
    raise RuntimeError("e" * size)


@tool
def surrogate() -> str:
    """A result protobuf cannot encode as is."""
    return "bad \ud800 text"


TOOLS = {t.name: t for t in (produce, fail_loudly, surrogate)}


async def call(
    name: str,
    arguments: str,
    executor: ToolExecutor | None,
    *,
    bus: FakeBus | None = None,
    stores: bool = True,
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
) -> ToolReply:
    bus = bus or FakeBus(max_payload=LIMIT)
    await bus.provision(JetStreamLayout())
    host = ToolHost(
        TOOLS,
        max_payload=LIMIT,
        objects=bus if stores else None,
        max_result_bytes=max_result_bytes,
        executor=executor,
    )
    async with bus.serve(host.router()):
        request = ToolCall(call_id="c1", name=name, arguments_json=arguments)
        return await bus.request(subjects.tool(name), request, ToolReply)


def produce_args(size: int, char: str = "x") -> str:
    return json.dumps({"size": size, "char": char}, ensure_ascii=False)


@pytest.mark.parametrize("char", ["x", "é", "😀"])
async def test_a_result_several_times_the_limit_is_stored_whole(char: str, executor: ToolExecutor | None) -> None:
    bus = FakeBus(max_payload=LIMIT)
    size = 5 * LIMIT  # characters: 5 to 20 times what one message carries
    result = await call("produce", produce_args(size, char), executor, bus=bus)
    assert not result.is_error
    assert not result.truncated
    assert result.content == ""
    assert result.result_object
    assert result.ByteSize() < 1024  # the reply only names the object
    stored = await bus.object_get(subjects.TOOL_RESULTS_BUCKET, result.result_object)
    assert stored is not None
    assert stored.decode("utf-8") == char * size


async def test_a_result_within_the_limit_is_untouched_and_not_stored(executor: ToolExecutor | None) -> None:
    bus = FakeBus(max_payload=LIMIT)
    result = await call("produce", produce_args(INLINE), executor, bus=bus)
    assert (result.content, result.truncated, result.result_object) == ("x" * INLINE, False, "")
    assert bus.object_names(subjects.TOOL_RESULTS_BUCKET) == []
    over = await call("produce", produce_args(INLINE + 1), executor, bus=bus)
    assert over.result_object  # one byte more is the first size that is stored


async def test_a_result_over_the_maximum_is_stored_cut_with_a_marker(executor: ToolExecutor | None) -> None:
    bus = FakeBus(max_payload=LIMIT)
    result = await call("produce", produce_args(300_000), executor, bus=bus, max_result_bytes=200_000)
    assert result.truncated
    stored = await bus.object_get(subjects.TOOL_RESULTS_BUCKET, result.result_object)
    assert stored is not None
    assert len(stored) <= 200_000
    kept, _, marker = stored.decode().partition("\n")
    assert kept == "x" * len(kept)
    assert marker == f"…[truncated: the result of produce is 300000 bytes; only the first {len(kept)} bytes are shown]"


@pytest.mark.parametrize("why", ["no-object-store", "bucket-not-provisioned"])
async def test_a_result_that_cannot_be_stored_is_cut_to_fit_with_a_marker(
    why: str, executor: ToolExecutor | None
) -> None:
    bus = FakeBus(max_payload=LIMIT)
    if why == "no-object-store":
        result = await call("produce", produce_args(LIMIT + 1, "é"), executor, bus=bus, stores=False)
    else:
        host = ToolHost(TOOLS, max_payload=LIMIT, objects=bus, executor=executor)  # nothing provisioned: the put fails
        async with bus.serve(host.router()):
            request = ToolCall(call_id="c1", name="produce", arguments_json=produce_args(LIMIT + 1, "é"))
            result = await bus.request(subjects.tool("produce"), request, ToolReply)
    assert not result.is_error
    assert result.truncated
    assert not result.result_object
    assert len(result.content.encode()) <= INLINE
    kept = len(result.content.split("\n…[truncated")[0].encode())
    whole = (LIMIT + 1) * 2
    assert result.content.endswith(
        f"…[truncated: the result of produce is {whole} bytes; only the first {kept} bytes are shown]"
    )


async def test_an_error_too_long_for_one_message_is_cut_not_stored(executor: ToolExecutor | None) -> None:
    bus = FakeBus(max_payload=LIMIT)
    result = await call("fail_loudly", json.dumps({"size": 2 * LIMIT}), executor, bus=bus)
    assert result.is_error
    assert result.truncated
    assert result.content.startswith("Error: eee")
    assert len(result.content.encode()) <= INLINE
    assert bus.object_names(subjects.TOOL_RESULTS_BUCKET) == []


async def test_a_lone_surrogate_in_a_result_is_replaced_not_a_failed_reply(executor: ToolExecutor | None) -> None:
    result = await call("surrogate", "{}", executor)
    assert result.content == "bad ? text"


@pytest.mark.parametrize(
    "arguments",
    ["[" * 20_000 + "]" * 20_000, '{"size": ' + "9" * 5000 + "}", "{", '"text"'],
    ids=["nested-20k", "5000-digits", "unterminated", "not-an-object"],
)
async def test_malformed_arguments_are_error_results(arguments: str, executor: ToolExecutor | None) -> None:
    result = await call("produce", arguments, executor)
    assert result.is_error
    assert result.content.startswith("Error: the arguments")
