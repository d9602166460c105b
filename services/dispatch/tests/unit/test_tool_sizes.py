"""Tool calls and results are sized for the bus: clear texts for the model, never a failed send."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from atmosphere.bus import JetStreamLayout, MessageContext, Router, ServiceError, subjects
from atmosphere.bus.sizes import ENVELOPE_ROOM, utf8_len
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.governance.v1.governance_pb2 import CheckToolCallRequest, Decision, ScreenRequest
from atmosphere.contracts.run.v1.run_pb2 import ApprovalDecision, RunEvent, RunSubmission
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolReply, WorkspaceScope
from atmosphere.dispatch.control import RunControl
from atmosphere.dispatch.tool_offload import MAX_OFFLOAD_PARTS, split_for_saving
from atmosphere.dispatch.tools import ToolGateway
from atmosphere.sdk.runtime import ToolCallRequest, ToolSpec

from .conftest import Policy, screen_answer

LIMIT = 64 * 1024
DATA = LIMIT - ENVELOPE_ROOM
SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}}


class TooLargeReplyError(ServiceError):
    code = "bus.payload_too_large"


@dataclass
class World:
    bus: FakeBus
    events: list[RunEvent] = field(default_factory=list)
    checks: list[CheckToolCallRequest] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    saves: list[ToolCall] = field(default_factory=list)
    result: str = "ok"
    refuse_saves: bool = False
    stored: str | None = None
    """A result the sandbox stored as an object (too large for its reply), when set."""

    async def emit(self, event: RunEvent) -> None:
        # What the run's event writer would do: the event must fit in one bus message.
        await self.bus.publish(subjects.run_events("r1"), event)
        self.events.append(event)

    def gateway(
        self, *, offload: bool = False, approval: bool = False, principal: Principal | None = None
    ) -> ToolGateway:
        spec = ToolSpec(name="echo", description="", parameters=SCHEMA, requires_approval=approval)
        local = ToolSpec(name="big", description="", parameters=SCHEMA)
        run = RunSubmission(run_id="r1", conversation_id="c1", agent="chat", principal=principal or Principal())

        async def big(_arguments: dict[str, object]) -> str:
            return self.result  # in process (like delegation): no bus message bounds it

        return ToolGateway(
            bus=self.bus,
            run=run,
            emit=self.emit,
            tools={"echo": spec, "big": local},
            local_tools={"big": big},
            control=self.control,
            workspace=WorkspaceScope(category="agents", owner="chat", agent_id="chat", conversation_id="c1"),
            offload_threshold=8000,
            offload=offload,
            approval_timeout=5,
        )

    control: RunControl = field(default_factory=lambda: RunControl("r1"))

    def kinds(self) -> list[str]:
        return [e.WhichOneof("kind") or "" for e in self.events]


@pytest.fixture
async def world() -> AsyncIterator[World]:
    bus = FakeBus(max_payload=LIMIT)
    await bus.provision(JetStreamLayout())
    state = World(bus)
    router = Router()

    async def check(request: CheckToolCallRequest, _ctx: MessageContext) -> Decision:
        state.checks.append(request)
        return Decision(allowed=True)

    async def echo(call: ToolCall, _ctx: MessageContext) -> ToolReply:
        state.calls.append(call)
        if state.result == "too-large":
            raise TooLargeReplyError("The answer is too large", details={"size": "70000", "limit": str(LIMIT)})
        if state.stored is not None:  # what the sandbox does with a result one reply cannot carry
            await bus.object_put(subjects.TOOL_RESULTS_BUCKET, "obj-1", state.stored.encode())
            return ToolReply(call_id=call.call_id, result_object="obj-1")
        return ToolReply(call_id=call.call_id, content=state.result)

    async def save(call: ToolCall, _ctx: MessageContext) -> ToolReply:
        state.saves.append(call)
        if state.refuse_saves:
            return ToolReply(call_id=call.call_id, content="Error: disk full", is_error=True)
        return ToolReply(call_id=call.call_id, content="Wrote it")

    router.add(subjects.governance("check_tool"), CheckToolCallRequest, check)
    router.add(subjects.governance("screen"), ScreenRequest, screen_answer(Policy()))
    router.add(subjects.tool("echo"), ToolCall, echo)
    router.add(subjects.memory_tool("write_file"), ToolCall, save)
    async with bus.serve(router):
        yield state


def call(arguments: str, name: str = "echo") -> ToolCallRequest:
    return ToolCallRequest(call_id="c1", name=name, arguments_json=arguments)


def arguments_of(size: int) -> str:
    """A JSON arguments object of exactly `size` bytes."""
    frame = len('{"text": ""}')
    return json.dumps({"text": "x" * (size - frame)})


@pytest.mark.parametrize("size", [DATA + 1, 10 * 1024 * 1024], ids=["one-byte-over", "10MB"])
async def test_arguments_over_the_limit_are_a_clear_tool_error(world: World, size: int) -> None:
    text = await world.gateway().run_tool(call(arguments_of(size)))
    assert text == f"Error: the arguments of tool echo are {size} bytes; the limit is {DATA}"
    assert world.kinds() == ["tool_error"]
    assert world.events[0].tool_error.error == text
    assert world.checks == []  # refused before governance: never "governance is unavailable"
    assert world.calls == []
    assert world.bus.is_connected


async def test_arguments_at_the_limit_are_checked_and_run(world: World) -> None:
    text = await world.gateway().run_tool(call(arguments_of(DATA)))
    assert text == "ok"
    assert len(world.checks) == 1
    assert len(world.calls) == 1
    assert world.kinds() == ["tool_start", "tool_result"]


async def test_arguments_that_grow_when_re_encoded_are_measured_as_sent(world: World) -> None:
    raw = json.dumps({"text": "é" * (DATA // 3)}, ensure_ascii=False)  # fits as UTF-8, not as \\u00e9
    assert utf8_len(raw) <= DATA
    text = await world.gateway().run_tool(call(raw))
    assert text.startswith("Error: the arguments of tool echo are ")
    assert text.endswith(f"bytes; the limit is {DATA}")
    assert world.calls == []


@pytest.mark.parametrize(
    "raw",
    ["[" * 20_000 + "]" * 20_000, '{"text": ' + "9" * 5000 + "}", '{"text": "\\ud800"', "[1, 2]"],
    ids=["nested-20k", "5000-digit-number", "unterminated", "not-an-object"],
)
async def test_malformed_arguments_are_invalid_arguments_not_a_crash(world: World, raw: str) -> None:
    text = await world.gateway().run_tool(call(raw))
    assert json.loads(text) == {
        "error": "invalid_arguments",
        "tool": "echo",
        "details": ["the arguments are not a JSON object"],
    }
    assert world.calls == []


async def test_a_result_over_the_limit_is_cut_with_a_marker_when_it_cannot_be_offloaded(world: World) -> None:
    world.result = "#" * (LIMIT - 100)  # what a sandbox can still send, over what an event carries
    text = await world.gateway().run_tool(call('{"text": "a"}'))
    assert utf8_len(text) <= DATA
    kept = text.count("#")
    assert text.endswith(
        f"…[truncated: the result of echo is {LIMIT - 100} bytes; only the first {kept} bytes are shown]"
    )
    [result] = [e.tool_result for e in world.events if e.WhichOneof("kind") == "tool_result"]
    assert result.result == text  # the model and the client see the same text


async def test_a_large_result_is_offloaded_in_parts_that_each_fit(world: World) -> None:
    world.result = "".join(f"line {i:06d} ünïcödé\n" for i in range(9000))  # ~200 KB, non-ASCII
    text = await world.gateway(offload=True).run_tool(call('{"text": "a"}', "big"))
    assert len(world.saves) > 1
    for save in world.saves:
        assert save.ByteSize() <= DATA  # every part's request fits in one message
    parts = [json.loads(s.arguments_json) for s in world.saves]
    assert "".join(p["content"] for p in parts) == world.result  # nothing lost
    paths = [p["path"] for p in parts]
    assert all(
        path.startswith("tool-output/big-") and path.endswith(f".part{i}.txt") for i, path in enumerate(paths, 1)
    )
    assert f"Full output saved in {len(paths)} parts, in order: {', '.join(paths)}" in text
    assert text.startswith(world.result[:1500])


async def test_a_result_beyond_the_last_part_is_said_to_be_cut(world: World) -> None:
    part = DATA - 1024 - 16  # what one save carries at this broker limit, roughly
    world.result = "z" * (part * (MAX_OFFLOAD_PARTS + 2))
    text = await world.gateway(offload=True).run_tool(call('{"text": "a"}', "big"))
    assert len(world.saves) == MAX_OFFLOAD_PARTS
    saved = sum(len(json.loads(s.arguments_json)["content"]) for s in world.saves)
    assert f"[Only the first {saved} of {len(world.result)} chars were saved" in text


async def test_a_result_that_cannot_be_saved_stays_inline_within_the_limit(world: World) -> None:
    world.refuse_saves = True
    world.result = "w" * 20_000
    text = await world.gateway(offload=True).run_tool(call('{"text": "a"}'))
    assert text == world.result  # under the limit: inline and whole, as before
    world.result = "w" * LIMIT
    text = await world.gateway(offload=True).run_tool(call('{"text": "a"}', "big"))
    assert "…[truncated: the result of big is" in text
    assert utf8_len(text) <= DATA


async def test_a_result_refused_as_too_large_by_the_bus_is_said_so(world: World) -> None:
    world.result = "too-large"
    text = await world.gateway().run_tool(call('{"text": "a"}'))
    assert text == f"Error: the result of tool echo was too large to send (70000 bytes; the limit is {LIMIT})"
    assert world.kinds()[-1] == "tool_error"


async def test_a_call_too_large_for_the_governance_check_is_refused_as_such(world: World) -> None:
    # A principal this large is absurd; it stands for any envelope that outgrows its room.
    principal = Principal(user_id="u", roles=["r" * 1000] * 20)
    text = await world.gateway(principal=principal).run_tool(call(arguments_of(DATA - 100)))
    assert text.startswith("Error: the tool call echo is too large for the governance check (")
    assert "refused (fail-closed)" in text
    assert world.calls == []


async def test_edited_approval_arguments_over_the_limit_are_refused(world: World) -> None:
    gateway = world.gateway(approval=True)
    running = asyncio.create_task(gateway.run_tool(call('{"text": "a"}')))
    while "approval_required" not in world.kinds():
        await asyncio.sleep(0.01)
    approval_id = world.events[-1].approval_required.approval_id
    edited = json.dumps({"arguments": {"text": "q" * DATA}})
    future = world.control._approvals[approval_id]
    future.set_result(ApprovalDecision(approval_id=approval_id, action="approve", payload_json=edited))
    text = await running
    assert text.startswith("Error: the approved arguments of tool echo are ")
    assert world.calls == []


def test_split_for_saving_keeps_every_character_in_order() -> None:
    content = 'ab"\\\n\x01é😀' * 5000
    parts = split_for_saving(content, max_json_bytes=4096, max_part_bytes=3000)
    assert "".join(parts) == content
    assert all(utf8_len(json.dumps(p, ensure_ascii=False)) <= 4096 and utf8_len(p) <= 3000 for p in parts)
    assert split_for_saving("", max_json_bytes=4096) == []
    assert len(split_for_saving(content, max_json_bytes=4096, max_part_bytes=3000, max_parts=3)) == 4


async def test_a_result_stored_as_an_object_is_read_whole_offloaded_and_deleted(world: World) -> None:
    world.stored = "".join(f"line {i:06d} ünïcödé\n" for i in range(12_000))  # ~270 KB: 4x the broker limit
    text = await world.gateway(offload=True).run_tool(call('{"text": "a"}'))
    parts = [json.loads(s.arguments_json) for s in world.saves]
    assert len(parts) > 1
    assert "".join(p["content"] for p in parts) == world.stored  # whole, in order
    assert all(save.ByteSize() <= DATA for save in world.saves)
    assert text.startswith(world.stored[:1500])  # the model gets the preview and the paths
    assert f"Full output saved in {len(parts)} parts, in order: " in text
    assert world.bus.object_names(subjects.TOOL_RESULTS_BUCKET) == []  # read once, then deleted
    [result] = [e.tool_result for e in world.events if e.WhichOneof("kind") == "tool_result"]
    assert result.result == text


async def test_a_stored_result_without_a_workspace_is_cut_with_its_whole_size(world: World) -> None:
    world.stored = "#" * (5 * LIMIT)
    text = await world.gateway(offload=False).run_tool(call('{"text": "a"}'))
    assert utf8_len(text) <= DATA
    kept = text.count("#")
    assert text.endswith(
        f"…[truncated: the result of echo is {5 * LIMIT} bytes; only the first {kept} bytes are shown]"
    )
    assert world.bus.object_names(subjects.TOOL_RESULTS_BUCKET) == []


async def test_a_stored_result_that_is_gone_is_a_tool_error(world: World) -> None:
    world.stored = "gone"
    gateway = world.gateway()

    async def expire_first(call: ToolCall, _ctx: MessageContext) -> ToolReply:
        return ToolReply(call_id=call.call_id, result_object="expired-before-it-was-read")

    router = Router()
    router.add(subjects.tool("late"), ToolCall, expire_first)
    gateway.tools = {**gateway.tools, "late": ToolSpec(name="late", description="", parameters=SCHEMA)}
    async with world.bus.serve(router):
        text = await gateway.run_tool(call('{"text": "a"}', "late"))
    assert text == (
        "Error: the result of tool late was too large for one message and could not be read back"
        " (it is no longer stored)"
    )
    assert world.kinds()[-1] == "tool_error"
