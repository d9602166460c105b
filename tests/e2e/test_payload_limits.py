"""One byte over the broker's limit, at every service's edge: a clear answer, never a lost connection.

The suite runs its own nats-server with `max_payload` lowered to 64 KiB (the default is 1 MiB):
the same code paths, with data small enough to keep the tests fast. For each service a message
is built that would be exactly one byte over the limit on the wire; the service answers within
the limit (pages, a cut with a marker, a clear refusal), its connection stays up (it answers
health, a normal run completes), and the broker never saw an oversized message from anyone
(nats-server logs every "Maximum Payload" violation and closes that connection).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import websockets
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus import NatsBus, PayloadTooLargeError, connect, subjects
from atmosphere.bus._codec import wire_size
from atmosphere.bus.runs import follow_run
from atmosphere.bus.sizes import ENVELOPE_ROOM
from atmosphere.contracts.common.v1.service_pb2 import HealthCheckRequest, HealthCheckResponse
from atmosphere.contracts.governance.v1.governance_pb2 import ScreenFactsRequest, ScreenFactsResponse
from atmosphere.contracts.memory.v1.memory_pb2 import (
    AppendTurnRequest,
    AppendTurnResponse,
    ChatMessage,
    LoadHistoryResponse,
    ReadFileRequest,
    ReadFileResponse,
)
from atmosphere.contracts.run.v1.run_pb2 import Complete, RunEvent, RunSubmission, ToolResult
from atmosphere.contracts.tape.v1.tape_pb2 import GetStepsRequest, GetStepsResponse, TapeRun, TapeStep
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolReply, WorkspaceScope
from atmosphere.dispatch.memory_client import MemoryClient
from atmosphere.tape.handlers import step_record
from atmosphere.testing import ScriptedModel, Stack, ToolCallScript, Turn, run_stack, wait_until
from atmosphere.testing.nats_server import NatsServer
from atmosphere.testing.pytest_plugin import delete_namespace_streams

from .conftest import service_map
from .wsclient import read_run, ws_url

pytestmark = pytest.mark.asyncio(loop_scope="module")

ADMIN_TOKEN = "payload-limits-admin"
LIMIT = 64 * 1024
"""The broker's `max_payload` in this suite."""
SCOPE = WorkspaceScope(category="agents", owner="chat", agent_id="chat", conversation_id="files")


@dataclass
class World:
    stack: Stack
    bus: NatsBus
    provider: ScriptedModel
    server: NatsServer
    url: str

    async def health(self, service: str) -> HealthCheckResponse:
        return await self.bus.request(
            subjects.service_health(service), HealthCheckRequest(), HealthCheckResponse, timeout=5
        )

    async def run(self, agent: str, message: str, conversation_id: str = "") -> list[RunEvent]:
        request = RunSubmission(
            run_id=uuid.uuid4().hex,
            session_id=str(uuid.uuid4()),
            conversation_id=conversation_id or uuid.uuid4().hex,
            agent=agent,
            message=message,
        )
        return [event async for event in follow_run(self.bus, request.run_id, submit=request)]

    def violations(self) -> list[str]:
        log = self.server.log_path.read_text(errors="replace")
        return [line for line in log.splitlines() if "maximum payload" in line.lower()]


@pytest.fixture(scope="module")
def limited_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    store = tmp_path_factory.mktemp("limited-nats")
    config = store / "limits.conf"
    config.write_text(f"max_payload: {LIMIT}\n")
    server = NatsServer(store, extra_args=("-c", str(config))).start()
    try:
        yield server
    finally:
        server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(limited_nats: NatsServer, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    namespace = f"p{uuid.uuid4().hex[:12]}"
    provider = ScriptedModel()
    async with provider.serving(), connect(limited_nats.url, name="payload-limits", namespace=namespace) as bus:
        services = service_map(
            limited_nats.url,
            namespace,
            Path(tmp_path_factory.mktemp("payload-limits")) / "data",
            app="tests.e2e.apps.payload_app:app",
            llm_base_url=provider.base_url,
            ingress={"admin_token": ADMIN_TOKEN},
        )
        try:
            async with run_stack(services, bus=bus) as stack:
                yield World(stack, bus, provider, limited_nats, await stack.ingress_url())
        finally:
            await delete_namespace_streams(bus, namespace)


@pytest.fixture(autouse=True)
def fresh_script(world: World) -> Iterator[None]:
    world.provider.turns.clear()
    world.provider.requests.clear()
    yield
    assert not world.provider.turns, "the test left scripted replies unused"


async def assert_still_serving(world: World, service: str) -> None:
    """`service` answers over its own connection, a normal run completes, the broker saw nothing oversized."""
    health = await world.health(service)
    assert health.ready, health
    events = await world.run("echo", "still serving")
    assert events[-1].WhichOneof("kind") == "complete"
    assert "".join(e.text_delta.text for e in events if e.WhichOneof("kind") == "text_delta") == "still serving"
    assert world.bus.is_connected
    assert world.violations() == []


def sized_text(build: Any, target: int, *, char: str = "x") -> tuple[Message, int]:
    """`build(n)` with the `n` for which its wire size is exactly `target` (sizes grow with `n`)."""
    n = target
    for _ in range(50):
        message, size = build(n)
        if size == target:
            return message, n
        n += (target - size) // len(char.encode()) or (1 if size < target else -1)
    raise AssertionError(f"no size hits {target} exactly")


async def test_the_broker_limit_is_the_servers(world: World) -> None:
    assert world.bus.max_payload == LIMIT


# -- ingress ----------------------------------------------------------------------------------------


async def test_ingress_a_prompt_over_the_limit_is_an_error_frame_and_the_socket_stays(world: World) -> None:
    effective = LIMIT - ENVELOPE_ROOM  # ingress's message limit under this broker
    async with websockets.connect(ws_url(world.url, "echo")) as ws:
        for prompt in ("p" * (LIMIT + 1), "q" * (effective + 1)):
            await ws.send(prompt)
            frame = json.loads(await ws.recv())
            assert frame["type"] == "error", frame
            assert frame.get("code") == "ingress.too_large", frame
        await ws.send("after the refusals")
        frames = await read_run(ws)
    assert frames[-1]["type"] == "complete"
    await assert_still_serving(world, "ingress")


# -- dispatch ---------------------------------------------------------------------------------------


async def test_dispatch_a_tool_call_one_byte_over_is_a_tool_error_for_the_model(world: World) -> None:
    run_id, conversation = uuid.uuid4().hex, uuid.uuid4().hex

    def tool_call(n: int) -> tuple[Message, int]:
        # The `ToolCall` dispatch would send to the sandbox, and its headers.
        call = ToolCall(
            call_id="call-1",
            name="produce",
            arguments_json=json.dumps({"size": 1, "char": "c" * n}),
            run_id=run_id,
            conversation_id=conversation,
            agent="toolbox",
        )
        call.principal.SetInParent()
        return call, wire_size(call.SerializeToString(), {"atmo-run-id": run_id})

    call, _ = sized_text(tool_call, LIMIT + 1)
    assert isinstance(call, ToolCall)
    arguments = json.loads(call.arguments_json)
    big = dataclasses.replace(
        Turn.tool_calls(ToolCallScript("produce", arguments, call_id="call-1")), split_arguments=8192
    )
    world.provider.script(big, Turn.text("understood"))
    request = RunSubmission(run_id=run_id, session_id="s", conversation_id=conversation, agent="toolbox", message="go")
    events = [event async for event in follow_run(world.bus, run_id, submit=request)]

    size = len(call.arguments_json.encode())
    expected = f"Error: the arguments of tool produce are {size} bytes; the limit is {LIMIT - ENVELOPE_ROOM}"
    errors = [e.tool_error.error for e in events if e.WhichOneof("kind") == "tool_error"]
    assert errors == [expected]
    assert events[-1].WhichOneof("kind") == "complete"
    told = world.provider.requests[-1]["messages"][-1]
    assert (told["role"], told["content"]) == ("tool", expected)
    await assert_still_serving(world, "dispatch")


# -- sandbox ----------------------------------------------------------------------------------------


async def test_sandbox_a_result_one_byte_over_travels_whole_as_a_stored_object(world: World) -> None:
    def result(n: int) -> tuple[Message, int]:
        reply = ToolReply(call_id="call-2", content="r" * n)
        return reply, wire_size(reply.SerializeToString(), None)

    _, n = sized_text(result, LIMIT + 1)
    call = ToolCall(call_id="call-2", name="produce", arguments_json=json.dumps({"size": n, "char": "r"}))
    reply = await world.bus.request(subjects.tool("produce"), call, ToolReply, timeout=10)
    assert not reply.is_error
    assert not reply.truncated
    assert (reply.content, bool(reply.result_object)) == ("", True)
    stored = await world.bus.object_get(subjects.TOOL_RESULTS_BUCKET, reply.result_object)
    await world.bus.object_delete(subjects.TOOL_RESULTS_BUCKET, reply.result_object)
    assert stored == b"r" * n  # nothing cut
    small = ToolCall(call_id="call-3", name="produce", arguments_json='{"size": 3}')
    assert (await world.bus.request(subjects.tool("produce"), small, ToolReply)).content == "xxx"
    await assert_still_serving(world, "sandbox")


async def read_whole_file(world: World, scope: WorkspaceScope, path: str) -> str:
    """A workspace file as memory's admin read pages it (`next_offset`)."""
    content, offset = "", 0
    for _ in range(100):
        reply = await world.bus.request(
            subjects.memory("files.read"), ReadFileRequest(workspace=scope, path=path, offset=offset), ReadFileResponse
        )
        content += reply.content
        if not reply.next_offset:
            return content
        offset = reply.next_offset
    raise AssertionError(f"{path} did not end within 100 pages")


async def stored_chunks(world: World) -> dict[str, int]:
    """The chunk subjects the tool-results bucket still holds (none once every result was read)."""
    name = world.bus.stream_name(subjects.TOOL_RESULTS_BUCKET)
    info = await world.bus.client.jetstream().stream_info(f"OBJ_{name}", subjects_filter=f"$O.{name}.C.>")
    return dict(info.state.subjects or {})


async def test_sandbox_a_result_several_times_the_limit_reaches_the_workspace_whole(world: World) -> None:
    size = 4 * LIMIT + 123  # characters of two bytes each: about eight times the broker limit
    conversation = uuid.uuid4().hex
    world.provider.script(Turn.tool_calls(ToolCallScript("produce", {"size": size, "char": "é"})), Turn.text("saved"))
    events = await world.run("filer", "go", conversation_id=conversation)
    assert events[-1].WhichOneof("kind") == "complete"
    [preview] = [e.tool_result.result for e in events if e.WhichOneof("kind") == "tool_result"]
    told = world.provider.requests[-1]["messages"][-1]
    assert (told["role"], told["content"]) == ("tool", preview)  # the model gets the preview, bounded
    assert preview.startswith("é" * 1500)
    assert len(preview.encode()) < 8 * 1024
    listing = preview.split(" parts, in order: ", 1)[1].split(" — use read_file", 1)[0]
    paths = listing.split(", ")
    assert len(paths) > 1
    scope = WorkspaceScope(category="agents", owner="filer", agent_id="filer", conversation_id=conversation)
    saved = "".join([await read_whole_file(world, scope, path) for path in paths])
    assert saved == "é" * size  # whole: nothing past the broker limit was lost
    assert "Only the first" not in preview
    assert await stored_chunks(world) == {}  # dispatch deleted the object it read
    await assert_still_serving(world, "sandbox")


# -- memory -----------------------------------------------------------------------------------------


async def test_memory_a_history_one_byte_over_comes_in_pages_and_reaches_the_model(world: World) -> None:
    conversation = uuid.uuid4().hex
    turns = [("user", "u" * 15_000), ("assistant", "a" * 15_000), ("user", "v" * 15_000)]

    def history(n: int) -> tuple[Message, int]:
        messages = [ChatMessage(role=r, content=c) for r, c in [*turns, ("assistant", "b" * n)]]
        reply = LoadHistoryResponse(messages=messages)
        return reply, wire_size(reply.SerializeToString(), None)

    whole, n = sized_text(history, LIMIT + 1)  # the history as ONE reply would be one byte over
    stored = [*turns, ("assistant", "b" * n)]
    for user, assistant in ((stored[0], stored[1]), (stored[2], stored[3])):
        append = AppendTurnRequest(
            agent="chat",
            conversation_id=conversation,
            run_id="seed",
            user=ChatMessage(role="user", content=user[1]),
            assistant=ChatMessage(role="assistant", content=assistant[1]),
        )
        await world.bus.request(subjects.memory("history.append"), append, AppendTurnResponse)

    loaded = await MemoryClient(world.bus).load_history("chat", conversation)
    assert [(m.role, m.content) for m in loaded] == stored

    world.provider.script(Turn.text("I remember"))
    events = await world.run("chat", "what did we say?", conversation_id=conversation)
    assert events[-1].WhichOneof("kind") == "complete"
    sent = world.provider.requests[-1]["messages"]
    assert [(m["role"], m["content"]) for m in sent[1:-1]] == stored  # the whole history, not none
    assert whole.ByteSize() == LIMIT + 1
    await assert_still_serving(world, "memory")


async def test_memory_a_file_read_one_byte_over_is_paged_with_offsets(world: World) -> None:
    def read_result(n: int) -> tuple[Message, int]:
        reply = ToolReply(call_id="read", content="f" * n)
        return reply, wire_size(reply.SerializeToString(), None)

    _, n = sized_text(read_result, LIMIT + 1)
    # Written in two requests that each fit: a write, then an edit that grows the file.
    first, rest = "f" * (n // 2) + "@@", "f" * (n - n // 2)

    async def tool(name: str, arguments: dict[str, Any]) -> ToolReply:
        call = ToolCall(call_id="read", name=name, arguments_json=json.dumps(arguments), workspace=SCOPE)
        return await world.bus.request(subjects.memory_tool(name), call, ToolReply, timeout=10)

    assert not (await tool("write_file", {"path": "big.txt", "content": first})).is_error
    assert not (await tool("edit_file", {"path": "big.txt", "old_text": "@@", "new_text": rest})).is_error
    pieces: list[str] = []
    offset = 0
    for _ in range(10):
        result = await tool("read_file", {"path": "big.txt", "offset": offset})
        assert not result.is_error
        assert result.ByteSize() <= LIMIT - ENVELOPE_ROOM
        text, marker, tail = result.content.partition("\n…[truncated: big.txt is ")
        pieces.append(text)
        if not marker:
            break
        offset = int(tail.rsplit("offset=", 1)[1].split(" ")[0])
    assert "".join(pieces) == "f" * n

    admin = ""
    offset = 0
    while True:
        reply = await world.bus.request(
            subjects.memory("files.read"),
            ReadFileRequest(workspace=SCOPE, path="big.txt", offset=offset),
            ReadFileResponse,
        )
        admin += reply.content
        if not reply.next_offset:
            break
        offset = reply.next_offset
    assert admin == "f" * n
    await assert_still_serving(world, "memory")


# -- governance -------------------------------------------------------------------------------------


async def test_governance_a_screen_one_byte_over_never_leaves_and_one_at_the_limit_is_answered(world: World) -> None:
    facts = ["The user likes plain facts " + "s" * 970 for _ in range(63)]

    def screen(n: int) -> tuple[Message, int]:
        request = ScreenFactsRequest(facts=[*facts, "The user likes " + "t" * n], user_id="ada")
        return request, wire_size(request.SerializeToString(), None)

    over, _ = sized_text(screen, LIMIT + 1)
    with pytest.raises(PayloadTooLargeError) as refused:
        await world.bus.request(subjects.governance("screen_facts"), over, ScreenFactsResponse)
    assert (refused.value.size, refused.value.limit) == (LIMIT + 1, LIMIT)

    at_limit, _ = sized_text(screen, LIMIT)
    assert isinstance(at_limit, ScreenFactsRequest)
    reply = await world.bus.request(subjects.governance("screen_facts"), at_limit, ScreenFactsResponse)
    assert len(reply.facts) == len(at_limit.facts)
    assert reply.ByteSize() <= LIMIT
    refused_facts = [f for f in reply.facts if not f.store]
    assert refused_facts  # the answer had no room for every fact: those are refused, not passed
    assert all(f.verdict == "ERROR" for f in refused_facts)
    await assert_still_serving(world, "governance")


# -- tape -------------------------------------------------------------------------------------------


async def test_tape_steps_one_byte_over_come_in_pages(world: World) -> None:
    run_id = uuid.uuid4().hex

    def event(seq: int, text: str | None) -> RunEvent:
        ts = Timestamp()
        ts.FromMilliseconds(1_700_000_000_000 + seq)
        kind: dict[str, Any] = {"complete": Complete()} if text is None else {"tool_result": ToolResult(result=text)}
        return RunEvent(run_id=run_id, seq=seq, session_id="s", conversation_id="c", agent="echo", timestamp=ts, **kind)

    def events_of(n: int) -> list[RunEvent]:
        return [event(1, "x" * 20_000), event(2, "y" * 20_000), event(3, "z" * n), event(4, None)]

    def steps_reply(n: int) -> tuple[Message, int]:
        records = [step_record(e) for e in events_of(n)]
        run = TapeRun(
            run_id=run_id,
            tape_id="c",
            session_id="s",
            agent="echo",
            status="COMPLETED",
            started_at=records[0].step.ts,
            ended_at=records[-1].step.ts,
            step_count=len(records),
        )
        steps = [TapeStep(seq=r.step.seq, kind=r.step.kind, payload_json=r.step.payload, ts=r.step.ts) for r in records]
        reply = GetStepsResponse(run_id=run_id, steps=steps, count=len(steps), run=run)
        return reply, wire_size(reply.SerializeToString(), None)

    whole, n = sized_text(steps_reply, LIMIT + 1)
    for e in events_of(n):
        await world.bus.js_publish(subjects.run_events(run_id), e)

    async def recorded() -> bool:
        page = await world.bus.request(subjects.tape("steps"), GetStepsRequest(run_id=run_id), GetStepsResponse)
        return page.run.step_count == 4

    await wait_until(recorded, what="the tape to record the four events")
    pages: list[GetStepsResponse] = []
    from_seq = 0
    while True:
        page = await world.bus.request(
            subjects.tape("steps"), GetStepsRequest(run_id=run_id, from_seq=from_seq), GetStepsResponse
        )
        assert page.ByteSize() <= LIMIT
        pages.append(page)
        if not page.next_from_seq:
            break
        from_seq = page.next_from_seq
    assert len(pages) >= 2
    assert [s for p in pages for s in p.steps] == list(whole.steps)  # type: ignore[attr-defined]
    # The admin API hands the pages on: `nextFromSeq` says where the next one starts.
    seqs: list[int] = []
    params: dict[str, int] = {}
    async with httpx.AsyncClient(base_url=world.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as http:
        while True:
            answer = (await http.get(f"/api/admin/tape/runs/{run_id}/steps", params=params)).json()
            seqs += [step["seq"] for step in answer["steps"]]
            if "nextFromSeq" not in answer:
                break
            params = {"fromSeq": answer["nextFromSeq"]}
    assert seqs == [1, 2, 3, 4]
    await assert_still_serving(world, "tape")
