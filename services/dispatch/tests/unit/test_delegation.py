"""`delegate_task` and `task` against the in-memory bus, with a fake worker answering the sub-runs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from atmosphere.bus import ConsumerSpec, JetStreamLayout, MessageContext, Router, WorkItem, subjects
from atmosphere.bus.runs import RUN_ID_METADATA_KEY, RunEventWriter
from atmosphere.bus.runs import SUBAGENT_DEPTH_METADATA_KEY as DEPTH_KEY
from atmosphere.bus.runs import subagent_depth_of as depth_of
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.common_pb2 import Error, Principal, Usage
from atmosphere.contracts.memory.v1.memory_pb2 import DropWorkspaceRequest, DropWorkspaceResponse
from atmosphere.contracts.run.v1.run_pb2 import (
    Complete,
    Control,
    ControlAck,
    Metadata,
    Progress,
    RunEvent,
    RunSubmission,
    TextDelta,
    ToolStart,
)
from atmosphere.dispatch.delegation import (
    SUBAGENT,
    WORKSPACE_KEY,
    Delegation,
    subagent_scope,
)
from atmosphere.dispatch.effects import ToolEffect
from atmosphere.dispatch.journal import RunJournal
from atmosphere.dispatch.memory_client import MemoryClient

FLEET = {"writer": "", "critic": ""}
HANG_CAP = 5.0
"""A hanging sub-run gives up on its own after this long (only if the cancel never came)."""


@dataclass
class World:
    """The bus, a fake worker answering sub-runs, a fake memory recording workspace drops."""

    bus: FakeBus
    submitted: list[RunSubmission] = field(default_factory=list)
    controls: list[Control] = field(default_factory=list)
    drops: list[DropWorkspaceRequest] = field(default_factory=list)
    forwarded: list[RunEvent] = field(default_factory=list)
    queued_on: list[str] = field(default_factory=list)
    """The subject each sub-run was queued on."""
    started: asyncio.Event = field(default_factory=asyncio.Event)

    async def emit(self, event: RunEvent) -> None:
        self.forwarded.append(event)

    def delegation(
        self, parent: RunSubmission | None = None, *, fleet: Mapping[str, str] = FLEET, **kw: Any
    ) -> Delegation:
        return Delegation(
            self.bus, parent or parent_run(), self.emit, fleet=fleet, memory=MemoryClient(self.bus, timeout=1), **kw
        )


def parent_run(**metadata: str) -> RunSubmission:
    return RunSubmission(
        run_id="parent-1",
        session_id="s1",
        conversation_id="c1",
        agent="lead",
        message="coordinate",
        principal=Principal(user_id="ada"),
        metadata=metadata,
    )


async def _hang(world: World, request: RunSubmission) -> None:
    """Serve the run's control subject (as the owning worker does) until a cancel arrives."""
    cancelled = asyncio.Event()

    async def on_control(control: Control, _ctx: MessageContext) -> ControlAck:
        world.controls.append(control)
        cancelled.set()
        return ControlAck(accepted=True)

    router = Router()
    router.add(subjects.run_control(request.run_id), Control, on_control)
    async with world.bus.serve(router):
        world.started.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(cancelled.wait(), HANG_CAP)


async def _answer(world: World, request: RunSubmission) -> None:
    """What a sub-run does, by its message: `hang`, `fail:<msg>`, `deny`, `empty`, `chatty`, or an echo."""
    writer = RunEventWriter(world.bus, request)
    message = request.message
    if message == "hang":
        await _hang(world, request)
        return
    world.started.set()
    if message.startswith("fail:"):
        await writer.emit(RunEvent(error=Error(code="agent.error", message=message.removeprefix("fail:"))))
    elif message == "deny":
        await writer.emit(
            RunEvent(
                error=Error(
                    code="governance.denied",
                    message="Request denied by policy no-spawn: too costly",
                    details={"policy": "no-spawn", "reason": "too costly"},
                )
            )
        )
    elif message == "empty":
        await writer.emit(RunEvent(complete=Complete()))
    elif message == "chatty":
        await writer.emit(RunEvent(progress=Progress(message="Thinking...")))
        await writer.emit(RunEvent(metadata=Metadata(key="model", value_json='"fake"')))
        await writer.emit(RunEvent(tool_start=ToolStart(tool_name="ls", call_id="t1", arguments_json="{}")))
        await writer.emit(RunEvent(text_delta=TextDelta(text="Hel")))
        # A grandchild's event the child forwarded: it keeps its innermost origin, and its text
        # is not the child's answer.
        await writer.emit(
            RunEvent(text_delta=TextDelta(text="[nested]"), origin_run_id="grandchild", origin_agent="deeper")
        )
        await writer.emit(RunEvent(text_delta=TextDelta(text="lo")))
        await writer.emit(RunEvent(usage=Usage(input_tokens=3, output_tokens=2)))
        await writer.emit(RunEvent(complete=Complete(summary="done")))
    else:
        await writer.emit(RunEvent(text_delta=TextDelta(text=f"  echo: {message}  ")))
        await writer.emit(RunEvent(complete=Complete()))


@pytest.fixture
async def world() -> AsyncIterator[World]:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    w = World(bus)

    async def drop(request: DropWorkspaceRequest, _ctx: MessageContext) -> DropWorkspaceResponse:
        w.drops.append(request)
        return DropWorkspaceResponse(existed=True)

    async def work(item: WorkItem[RunSubmission]) -> None:
        request = item.envelope.message
        w.submitted.append(request)
        w.queued_on.append(item.envelope.subject)
        await _answer(w, request)

    memory = Router()
    memory.add(subjects.memory("workspace.drop"), DropWorkspaceRequest, drop)
    consumer = ConsumerSpec(
        stream=subjects.RUNS_STREAM, durable="fake-workers", filter_subject=subjects.run_submit_all()
    )
    async with bus.serve(memory), bus.consume(consumer, RunSubmission, work, drain_timeout=2):
        yield w


def only_child(world: World) -> RunSubmission:
    assert len(world.submitted) == 1
    return world.submitted[0]


def assert_dropped_workspace_of(world: World, child: RunSubmission) -> None:
    """The sub-agent's whole workspace was dropped exactly once, and it is the child's own."""
    assert len(world.drops) == 1
    drop = world.drops[0]
    assert not drop.conversation_only
    owner_meta = json.loads(child.metadata[WORKSPACE_KEY])
    assert drop.workspace.category == "subagents"
    assert re.fullmatch(r"[0-9a-f]{32}", drop.workspace.owner)
    assert drop.workspace.owner == owner_meta["owner"]
    assert drop.workspace.agent_id == owner_meta["agentId"] == f"subagent-{drop.workspace.owner[:8]}"
    assert drop.workspace.conversation_id == child.conversation_id
    assert subagent_scope(child) == drop.workspace


# -- task: refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize("description", [None, "", "   "])
async def test_task_needs_a_description(world: World, description: str | None) -> None:
    arguments = {} if description is None else {"description": description}
    assert await world.delegation().task(arguments) == "task failed: 'description' is required."
    assert world.submitted == []
    assert world.drops == []


@pytest.mark.parametrize("kind", ["researcher", "general_purpose"])
async def test_task_refuses_an_unknown_subagent_type(world: World, kind: str) -> None:
    result = await world.delegation().task({"description": "x", "subagent_type": kind})
    assert result == (
        f"task failed: unknown subagent_type '{kind}'. Only 'general-purpose' is supported — use delegate_task "
        "for a named fleet specialist."
    )
    assert world.submitted == []


async def test_task_accepts_general_purpose_in_any_case(world: World) -> None:
    result = await world.delegation().task({"description": "hi", "subagent_type": " General-Purpose "})
    assert result == "echo: hi"


@pytest.mark.parametrize("depth", ["2", "3", "17"])
async def test_task_refuses_past_the_nesting_depth(world: World, depth: str) -> None:
    result = await world.delegation(parent_run(**{DEPTH_KEY: depth})).task({"description": "go deeper"})
    assert result == (
        "task refused: maximum subagent nesting depth (2) reached — complete this step inline instead of "
        "spawning again."
    )
    assert world.submitted == []
    assert world.drops == []


async def test_a_nested_task_runs_one_level_deeper(world: World) -> None:
    assert await world.delegation(parent_run(**{DEPTH_KEY: "1"})).task({"description": "inner"}) == "echo: inner"
    assert only_child(world).metadata[DEPTH_KEY] == "2"


@pytest.mark.parametrize(("raw", "depth"), [("", 0), ("1", 1), ("-4", 0), ("deep", 0)])
def test_depth_of_is_lenient(raw: str, depth: int) -> None:
    run = parent_run(**({DEPTH_KEY: raw} if raw else {}))
    assert depth_of(run) == depth


async def test_the_ninth_spawn_is_refused_and_failed_spawns_count(world: World) -> None:
    delegation = world.delegation()
    results = [await delegation.task({"description": f"step {i}"}) for i in range(6)]
    results += [await delegation.task({"description": "fail:nope"}) for _ in range(2)]
    assert results == [f"echo: step {i}" for i in range(6)] + ["task failed: nope"] * 2
    ninth = await delegation.task({"description": "one more"})
    assert ninth == "task refused: maximum subagent spawns (8) for this request reached."
    assert len(world.submitted) == 8
    assert len(world.drops) == 8
    # The budget belongs to this request: another coordinator run starts afresh.
    assert await world.delegation().task({"description": "fresh"}) == "echo: fresh"


# -- task: outcomes --------------------------------------------------------------------------------


async def test_task_success_returns_the_stripped_report_and_drops_the_workspace(world: World) -> None:
    parent = parent_run()
    assert await world.delegation(parent).task({"description": "  summarize the repo "}) == ("echo: summarize the repo")
    child = only_child(world)
    assert child.agent == SUBAGENT
    assert child.message == "summarize the repo"
    assert child.parent_run_id == parent.run_id
    assert child.principal.user_id == "ada"
    assert child.conversation_id not in {"", parent.conversation_id}
    assert child.metadata[DEPTH_KEY] == "1"
    assert child.metadata["subagent.spawn"] == "general-purpose"
    assert_dropped_workspace_of(world, child)
    assert world.controls == []  # a finished sub-run is not cancelled


async def test_a_strict_parent_mode_travels_to_every_sub_run(world: World) -> None:
    assert await world.delegation(permission_mode="PLAN").task({"description": "look"}) == "echo: look"
    assert only_child(world).metadata["ai.permissionMode"] == "PLAN"


async def test_every_spawn_gets_a_fresh_conversation_and_workspace(world: World) -> None:
    delegation = world.delegation()
    await delegation.task({"description": "a"})
    await delegation.task({"description": "b"})
    first, second = world.submitted
    assert first.conversation_id != second.conversation_id
    assert world.drops[0].workspace.owner != world.drops[1].workspace.owner


async def test_task_with_no_output(world: World) -> None:
    assert await world.delegation().task({"description": "empty"}) == "task completed with no output."
    assert_dropped_workspace_of(world, only_child(world))


async def test_task_error_is_a_failure_text_and_still_drops_the_workspace(world: World) -> None:
    assert await world.delegation().task({"description": "fail:the disk is full"}) == ("task failed: the disk is full")
    assert_dropped_workspace_of(world, only_child(world))
    assert await world.delegation().task({"description": "fail:"}) == "task failed: unknown error"


async def test_a_governance_denial_of_the_spawn_reads_as_denied(world: World) -> None:
    result = await world.delegation().task({"description": "deny"})
    assert result == "task denied by policy: too costly"
    assert_dropped_workspace_of(world, only_child(world))


async def test_task_timeout_cancels_the_sub_run_and_drops_the_workspace(world: World) -> None:
    result = await world.delegation(timeout=0.2).task({"description": "hang"})
    assert result == "task did not complete within 0.2 seconds."
    child = only_child(world)
    assert [c.run_id for c in world.controls] == [child.run_id]
    assert world.controls[0].WhichOneof("action") == "cancel"
    assert_dropped_workspace_of(world, child)


async def test_a_cancelled_parent_cancels_the_sub_run_and_drops_the_workspace(world: World) -> None:
    running = asyncio.create_task(world.delegation().task({"description": "hang"}))
    await asyncio.wait_for(world.started.wait(), 2)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    child = only_child(world)
    assert [c.run_id for c in world.controls] == [child.run_id]
    assert_dropped_workspace_of(world, child)


async def test_an_unreachable_bus_is_a_failure_text_and_still_drops(world: World) -> None:
    bus = FakeBus()  # no streams: the sub-run cannot even be submitted
    drops: list[DropWorkspaceRequest] = []

    async def drop(request: DropWorkspaceRequest, _ctx: MessageContext) -> DropWorkspaceResponse:
        drops.append(request)
        return DropWorkspaceResponse()

    router = Router()
    router.add(subjects.memory("workspace.drop"), DropWorkspaceRequest, drop)
    async with bus.serve(router):
        delegation = Delegation(bus, parent_run(), world.emit, fleet=FLEET, memory=MemoryClient(bus, timeout=1))
        result = await delegation.task({"description": "anything"})
    assert result.startswith("task failed: the sub-run could not be followed")
    assert len(drops) == 1


# -- forwarding ------------------------------------------------------------------------------------


@pytest.mark.parametrize("tool", ["task", "delegate_task"])
async def test_child_events_are_forwarded_tagged_with_their_origin(world: World, tool: str) -> None:
    delegation = world.delegation()
    if tool == "task":
        result = await delegation.task({"description": "chatty"})
        agent = SUBAGENT
    else:
        result = await delegation.delegate_task({"agent": "writer", "message": "chatty"})
        agent = "writer"
    assert result == "Hello"  # the nested sub-run's text is not this child's answer
    child = only_child(world)
    kinds = [e.WhichOneof("kind") for e in world.forwarded]
    assert kinds == ["progress", "metadata", "tool_start", "text_delta", "text_delta", "text_delta", "usage"]
    for event in world.forwarded:
        assert event.WhichOneof("kind") not in {"complete", "error"}
        assert not (event.WhichOneof("kind") == "metadata" and event.metadata.key == RUN_ID_METADATA_KEY)
        if event.text_delta.text == "[nested]":
            assert (event.origin_run_id, event.origin_agent) == ("grandchild", "deeper")
        else:
            assert (event.origin_run_id, event.origin_agent) == (child.run_id, agent)
    assert [e.text_delta.text for e in world.forwarded if e.HasField("text_delta")] == ["Hel", "[nested]", "lo"]
    assert world.forwarded[0].progress.message == "Thinking..."
    assert world.forwarded[2].tool_start.tool_name == "ls"


# -- delegate_task ---------------------------------------------------------------------------------


async def test_a_member_pinned_to_a_runtime_is_queued_in_its_pool(world: World) -> None:
    fleet = {"writer": "langchain", "critic": ""}
    result = await world.delegation(fleet=fleet).delegate_task({"agent": "writer", "message": "hi"})
    assert result.strip() == "echo: hi"
    assert only_child(world).pool == "langchain"
    assert world.queued_on == [subjects.run_submit("writer", level=1, pool="langchain")]


async def test_a_task_sub_agent_runs_in_its_parents_pool(world: World) -> None:
    parent = parent_run()
    parent.pool = "pydantic-ai"
    assert await world.delegation(parent).task({"description": "hi"}) == "echo: hi"
    assert only_child(world).pool == "pydantic-ai"
    assert world.queued_on == [subjects.run_submit(SUBAGENT, level=1, pool="pydantic-ai")]


async def test_delegate_task_without_a_fleet(world: World) -> None:
    result = await world.delegation(fleet={}).delegate_task({"agent": "writer", "message": "hi"})
    assert result == "delegate_task unavailable: no agent fleet is bound to this session."
    assert world.submitted == []


@pytest.mark.parametrize("agent", [None, "", "  "])
async def test_delegate_task_needs_an_agent(world: World, agent: str | None) -> None:
    arguments = {"message": "hi"} if agent is None else {"agent": agent, "message": "hi"}
    assert await world.delegation().delegate_task(arguments) == (
        "delegate_task failed: 'agent' is required. Available agents: [writer, critic]"
    )
    assert world.submitted == []


async def test_delegate_task_to_an_unknown_agent_lists_the_fleet(world: World) -> None:
    assert await world.delegation().delegate_task({"agent": "ghost", "message": "hi"}) == (
        "delegate_task failed: unknown agent 'ghost'. Available agents: [writer, critic]"
    )
    assert world.submitted == []


async def test_delegate_task_returns_the_member_reply(world: World) -> None:
    parent = parent_run()
    result = await world.delegation(parent).delegate_task({"agent": " writer ", "message": "draft it"})
    assert result == "  echo: draft it  "  # the member's text as it said it
    child = only_child(world)
    assert child.agent == "writer"
    assert child.message == "draft it"
    assert child.parent_run_id == parent.run_id
    assert child.principal.user_id == "ada"
    assert child.conversation_id == "c1--writer"
    assert child.metadata[DEPTH_KEY] == "0"
    assert child.metadata["fleet.dispatch.agent"] == "writer"
    assert world.drops == []  # a fleet member keeps its own workspace


async def test_delegate_task_surfaces_the_member_error(world: World) -> None:
    result = await world.delegation().delegate_task({"agent": "critic", "message": "fail:out of ideas"})
    assert result == "delegate_task to 'critic' failed: out of ideas"
    assert await world.delegation().delegate_task({"agent": "critic", "message": "fail:"}) == (
        "delegate_task to 'critic' failed: no error detail"
    )


async def test_delegate_task_timeout_cancels_the_member_run(world: World) -> None:
    result = await world.delegation(timeout=0.2).delegate_task({"agent": "writer", "message": "hang"})
    assert result == "delegate_task to 'writer' failed: no reply within 0.2 seconds"
    assert [c.run_id for c in world.controls] == [only_child(world).run_id]


# -- durable parents ----------------------------------------------------------------------------


@contextlib.contextmanager
def inside_journaled_call(world: World, key: str) -> Iterator[None]:
    """As the tool gateway runs a durable run's call: the call's journal key is current."""
    effect = ToolEffect(journal=RunJournal(world.bus, "parent-1", owner="w1"), key=key, digest="d")
    token = effect.enter()
    try:
        yield
    finally:
        ToolEffect.leave(token)


async def test_a_durable_parents_resumed_delegation_finds_its_sub_run_instead_of_starting_another(
    world: World,
) -> None:
    key = "ab" * 32
    with inside_journaled_call(world, key):
        first = await world.delegation().delegate_task({"agent": "writer", "message": "draft it"})
    child = only_child(world)
    assert child.run_id == key[:32]  # derived from the call, not random
    # The parent's worker died after the sub-run ended, before the call's result was journaled;
    # the resumed call (same key) follows the sub-run it had started, from its first event.
    with inside_journaled_call(world, key):
        again = await world.delegation().delegate_task({"agent": "writer", "message": "draft it"})
    assert again == first == "  echo: draft it  "
    assert len(world.submitted) == 1  # not a second sub-run


async def test_a_durable_parents_task_keeps_its_sub_agents_ids(world: World) -> None:
    key = "cd" * 32
    with inside_journaled_call(world, key):
        await world.delegation().task({"description": "research it"})
    child = only_child(world)
    assert child.run_id == key[:32]
    assert json.loads(child.metadata[WORKSPACE_KEY])["owner"] == key[32:]
