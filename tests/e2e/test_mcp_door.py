"""The MCP door, driven by the `mcp` SDK's own client over streamable HTTP against a real stack.

One stack for the module (all six services' real `serve()` on a real nats-server, a scripted
model provider), with token grants and a policy file: agents listed and called as tools, their
text streamed as progress, approvals elicited in both protocol eras (or refused at once where
the client cannot elicit), cancellation, a denied tool, a second user, the size limit, PII.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import httpx2
import mcp_types as types
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client

from atmosphere.bus import subjects
from atmosphere.bus.errors import RunCancelledError
from atmosphere.bus.runs import last_event
from atmosphere.bus.sizes import ENVELOPE_ROOM
from atmosphere.contracts.tape.v1.tape_pb2 import ListRunsRequest, ListRunsResponse
from atmosphere.testing import ToolCallScript, Turn, wait_until

from .doors_stack import ADA, ADA_ECHO, BOB, EMAIL, MESSAGE_LIMIT, World, doors_world

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    async with doors_world(nats_url, tmp_path_factory.mktemp("mcp-door")) as world:
        yield world


@pytest.fixture(autouse=True)
def fresh_script(world: World) -> Iterator[None]:
    with world.fresh():
        yield


@dataclass
class Progress:
    messages: list[str]

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        del progress, total
        self.messages.append(message or "")


class Approver:
    """An elicitation callback answering every approval with `approve`."""

    def __init__(self, approve: bool) -> None:
        self.approve = approve
        self.asked: list[str] = []

    async def __call__(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        del context
        self.asked.append(params.message)
        return types.ElicitResult(action="accept", content={"approve": self.approve})


@contextlib.asynccontextmanager
async def mcp_client(
    world: World, token: str, *, mode: str = "auto", approver: Approver | None = None
) -> AsyncIterator[Client]:
    """The `mcp` SDK's client on the door, with `token` (a client that elicits when `approver` is given)."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60)) as http:
        transport = streamable_http_client(f"{world.url}/atmosphere/mcp", http_client=http)
        async with Client(transport, mode=mode, elicitation_callback=approver) as client:
            yield client


def meta_of(result: types.CallToolResult) -> dict[str, Any]:
    assert result.meta is not None
    return dict(result.meta)


def text_of(result: types.CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, types.TextContent))


async def test_the_agents_a_token_may_use_are_its_tools(world: World) -> None:
    async with mcp_client(world, ADA) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == {"echo", "notes", "planner", "keeper"}
    assert tools["notes"].description == "Manages notes."
    assert tools["echo"].input_schema["required"] == ["message"]
    async with mcp_client(world, ADA_ECHO) as client:
        assert [tool.name for tool in (await client.list_tools()).tools] == ["echo"]
        outside = await client.call_tool("notes", {"message": "hi"})
    assert outside.is_error
    assert text_of(outside) == "Error: Unknown tool 'notes'"


@pytest.mark.parametrize("token", ["", "not-a-token"])
async def test_no_valid_token_is_a_401_before_anything_runs(world: World, token: str) -> None:
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.post(f"{world.url}/atmosphere/mcp", json=body, headers=headers)
    assert response.status_code == 401
    assert response.json()["code"] == "ingress.unauthorized"
    assert response.headers["www-authenticate"].startswith("Bearer")


async def test_a_page_of_another_origin_is_refused(world: World) -> None:
    headers = {
        "Authorization": f"Bearer {ADA}",
        "Origin": "https://evil.example",
        "Accept": "application/json, text/event-stream",
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.post(f"{world.url}/atmosphere/mcp", json=body, headers=headers)
    assert response.status_code == 403


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_an_agent_call_streams_its_text_as_progress(world: World, mode: str) -> None:
    progress = Progress([])
    async with mcp_client(world, ADA, mode=mode) as client:
        result = await client.call_tool("echo", {"message": "hello brave new world"}, progress_callback=progress)
    assert not result.is_error
    assert text_of(result) == "hello brave new world"
    assert "".join(progress.messages) == "hello brave new world"
    assert len(progress.messages) >= 2  # streamed in pieces (pieces released together are joined)
    run_id = meta_of(result)["atmosphere/runId"]
    last = await last_event(world.bus, run_id)
    assert last is not None
    assert last.WhichOneof("kind") == "complete"
    assert last.owner == "ada"


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_an_approval_is_elicited_and_the_tool_runs_once(world: World, mode: str) -> None:
    world.provider.script(
        Turn.tool_calls(ToolCallScript("delete_note", {"title": "groceries"})), Turn.text("Deleted it.")
    )
    approver = Approver(approve=True)
    async with mcp_client(world, ADA, mode=mode, approver=approver) as client:
        result = await client.call_tool("notes", {"message": "delete my groceries note"})
    assert not result.is_error, text_of(result)
    assert text_of(result) == "Deleted it."
    assert len(approver.asked) == 1
    assert "delete_note" in approver.asked[0]
    assert world.ran() == ["delete_note groceries"]


async def test_a_declined_approval_never_runs_the_tool(world: World) -> None:
    world.provider.script(
        Turn.tool_calls(ToolCallScript("delete_note", {"title": "groceries"})), Turn.text("I did not delete it.")
    )
    async with mcp_client(world, ADA, approver=Approver(approve=False)) as client:
        result = await client.call_tool("notes", {"message": "delete my groceries note"})
    assert text_of(result) == "I did not delete it."
    assert world.ran() == []


async def test_a_client_that_cannot_elicit_is_told_at_once_and_the_run_is_cancelled(world: World) -> None:
    world.provider.script(Turn.tool_calls(ToolCallScript("delete_note", {"title": "groceries"})))
    async with mcp_client(world, ADA) as client:
        with anyio.fail_after(10):  # at once: never the approval's timeout
            result = await client.call_tool("notes", {"message": "delete my groceries note"})
    assert result.is_error
    assert "needs a human's approval" in text_of(result)
    assert meta_of(result)["atmosphere/code"] == "ingress.approval_required"
    run_id = meta_of(result)["atmosphere/runId"]

    async def cancelled() -> bool:
        last = await last_event(world.bus, run_id)
        return last is not None and last.WhichOneof("kind") == "error"

    await wait_until(cancelled, what="the run to end")
    assert world.ran() == []


async def test_a_tool_denied_by_policy_never_runs(world: World) -> None:
    world.provider.script(
        Turn.tool_calls(ToolCallScript("drop_table", {"table": "users"})), Turn.text("I may not drop it.")
    )
    async with mcp_client(world, ADA) as client:
        result = await client.call_tool("notes", {"message": "drop the users table"})
    assert text_of(result) == "I may not drop it."
    told = [m for m in world.provider.requests[-1]["messages"] if m["role"] == "tool"]
    assert "denied by policy 'no-drops'" in told[0]["content"]
    assert world.ran() == []


@pytest.mark.parametrize("vanish", [False, True], ids=["cancels", "vanishes"])
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_client_that_cancels_or_vanishes_cancels_its_run(world: World, mode: str, vanish: bool) -> None:
    # Long enough for the output guard (the PII policy) to let text through before the end.
    world.provider.script(Turn.text("thinking " * 60, chunk_delay=0.15))
    conversation = f"cancel-{uuid.uuid4().hex[:8]}"
    started = Progress([])

    async def call(client: Client) -> None:
        await client.call_tool(
            "notes", {"message": "think", "conversation_id": conversation}, progress_callback=started
        )

    async def ended() -> bool:
        reply = await world.bus.request(subjects.tape("runs"), ListRunsRequest(limit=200), ListRunsResponse)
        mine = [run for run in reply.runs if run.tape_id.endswith(conversation)]
        last = await last_event(world.bus, mine[0].run_id) if mine else None
        return last is not None and last.WhichOneof("kind") in {"complete", "error"}

    async with mcp_client(world, ADA, mode=mode) as client:
        async with anyio.create_task_group() as group:
            group.start_soon(call, client)
            await wait_until(lambda: _truth(bool(started.messages)), what="the first progress")
            group.cancel_scope.cancel()
        if not vanish:  # else the client closes at once: its connection goes with it
            await wait_until(ended, timeout=15, what="the run to end")
    await wait_until(ended, timeout=15, what="the run to end")
    reply = await world.bus.request(subjects.tape("runs"), ListRunsRequest(limit=200), ListRunsResponse)
    [run] = [run for run in reply.runs if run.tape_id.endswith(conversation)]
    last = await last_event(world.bus, run.run_id)
    assert last is not None
    assert last.error.code == RunCancelledError.code


async def _truth(value: bool) -> bool:
    return value


async def test_another_user_cannot_follow_or_reach_an_mcp_run(world: World) -> None:
    async with mcp_client(world, ADA) as client:
        result = await client.call_tool("echo", {"message": "ada's secret", "conversation_id": "ada-conv"})
    run_id = meta_of(result)["atmosphere/runId"]
    async with httpx.AsyncClient(base_url=world.url, timeout=10) as http:
        stranger = await http.get(f"/atmosphere/runs/{run_id}/events", headers={"Authorization": f"Bearer {BOB}"})
        owner = await http.get(f"/atmosphere/runs/{run_id}/events", headers={"Authorization": f"Bearer {ADA}"})
    assert stranger.status_code == 404
    assert owner.status_code == 200
    assert "secret" in owner.text


async def test_the_largest_message_is_served_and_one_byte_more_is_a_clear_error(world: World) -> None:
    limit = MESSAGE_LIMIT  # well below the broker's max_payload less ENVELOPE_ROOM: the setting decides
    assert limit < (1 << 20) - ENVELOPE_ROOM
    async with mcp_client(world, ADA) as client:
        served = await client.call_tool("echo", {"message": "é" * (limit // 2)})
        over = await client.call_tool("echo", {"message": "é" * (limit // 2) + "x"})
    assert not served.is_error
    assert text_of(served) == "é" * (limit // 2)
    assert over.is_error
    assert text_of(over) == f"Error: The message exceeds {limit} bytes"
    assert meta_of(over)["atmosphere/code"] == "ingress.too_large"


async def test_an_email_in_an_answer_never_reaches_the_mcp_client(world: World) -> None:
    leaky = "Here is the account summary you asked for. " * 6 + f"Contact {EMAIL} for refunds. " + "Thanks. " * 30
    world.provider.script(Turn.text(leaky, words=False))
    progress = Progress([])
    async with mcp_client(world, ADA) as client:
        result = await client.call_tool("notes", {"message": "summarise"}, progress_callback=progress)
    assert EMAIL not in text_of(result)
    assert all(EMAIL not in message for message in progress.messages)
    assert result.is_error
    assert "Response blocked: response contains PII of kinds: [email]" in text_of(result)


async def test_malformed_arguments_are_clear_errors(world: World) -> None:
    async with mcp_client(world, ADA) as client:
        empty = await client.call_tool("echo", {"message": "  "})
        extra = await client.call_tool("echo", {"message": "hi", "sudo": True})
        bad_conversation = await client.call_tool("echo", {"message": "hi", "conversation_id": "../../etc"})
    assert text_of(empty) == "Error: 'message' must be a non-empty string"
    assert text_of(extra) == "Error: Unknown arguments: sudo"
    assert bad_conversation.is_error
    assert "Malformed conversation id" in text_of(bad_conversation)


async def test_the_info_says_the_door_is_served(world: World) -> None:
    async with httpx.AsyncClient(base_url=world.url, timeout=10) as http:
        info = (await http.get("/api/console/info", headers={"Authorization": f"Bearer {ADA}"})).json()
    assert info["mcp"] == {"path": "/atmosphere/mcp", "transport": "streamable-http", "tools": "agents"}
