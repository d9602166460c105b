"""The app's `@tool`s on the MCP door (`ATMOSPHERE_MCP__TOOLS=*`), driven by the `mcp` SDK's own client.

One stack for the module (the doors' stack: all six services' real `serve()` on a real
nats-server, the policy file denying `drop_*` tools and keeping PII out), exposing every app tool:
each listed as `<agent>__<tool>` with its schema only for a caller who may use its agent, each call
a run of its agent with that one call and no model, through the tool choke point (governance,
approval by elicitation, tape).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import anyio
import httpx
import pytest
import pytest_asyncio

from atmosphere.bus import subjects
from atmosphere.bus.errors import ToolCallFailedError, ToolCallRefusedError
from atmosphere.bus.runs import last_event
from atmosphere.config import TokenGrant
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.contracts.tape.v1.tape_pb2 import GetStepsRequest, GetStepsResponse
from atmosphere.testing import wait_until

from .doors_stack import ADA, BOB, EMAIL, GRANTS, MESSAGE_LIMIT, World, doors_world
from .test_mcp_door import Approver, Progress, mcp_client, meta_of, text_of

pytestmark = pytest.mark.asyncio(loop_scope="module")

CY_ECHO = "token-cy-echo-only"
"""A second user granted the echo agent only (not notes, whose tools are exposed)."""
NOTES_TOOLS = {"notes__delete_note", "notes__drop_table", "notes__read_note"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    grants = (*GRANTS, TokenGrant(token=CY_ECHO, user_id="cy", paths=("/atmosphere/agent/echo",)))
    async with doors_world(nats_url, tmp_path_factory.mktemp("mcp-tools"), mcp_tools=("*",), grants=grants) as world:
        yield world


@pytest.fixture(autouse=True)
def fresh_script(world: World) -> Iterator[None]:
    with world.fresh():
        yield


async def ended(world: World, run_id: str) -> RunEvent:
    last = await last_event(world.bus, run_id)
    assert last is not None
    return last


async def test_the_tools_of_the_agents_a_token_may_use_are_listed_with_their_schemas(world: World) -> None:
    async with mcp_client(world, ADA) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    # The agents, and their own @tools (the planner's harness `write_todos` is not an app tool).
    assert set(tools) == {"echo", "notes", "planner", "keeper"} | NOTES_TOOLS
    read = tools["notes__read_note"]
    assert read.description is not None
    assert read.description.startswith("Read a note.")
    assert read.input_schema["type"] == "object"
    assert read.input_schema["required"] == ["title"]
    assert read.input_schema["properties"]["title"]["type"] == "string"
    assert read.annotations is not None
    assert read.annotations.read_only_hint is True
    assert tools["notes__drop_table"].annotations is not None
    assert tools["notes__drop_table"].annotations.destructive_hint is True
    assert dict(read.meta or {}) == {"atmosphere/agent": "notes", "atmosphere/tool": "read_note"}


async def test_a_call_runs_the_tool_once_with_no_model_and_returns_its_result(world: World) -> None:
    progress = Progress([])
    async with mcp_client(world, ADA) as client:
        result = await client.call_tool("notes__read_note", {"title": "groceries"}, progress_callback=progress)
    assert not result.is_error, text_of(result)
    assert text_of(result) == "note 'groceries': buy milk"
    assert world.ran() == ["read_note groceries"]
    assert world.provider.requests == []  # no model round
    run_id = meta_of(result)["atmosphere/runId"]
    last = await ended(world, run_id)
    assert last.WhichOneof("kind") == "complete"
    assert (last.owner, last.agent) == ("ada", "notes")

    steps: list[str] = []

    async def taped() -> bool:
        reply = await world.bus.request(subjects.tape("steps"), GetStepsRequest(run_id=run_id), GetStepsResponse)
        steps[:] = [step.kind for step in reply.steps]
        return reply.run.status == "COMPLETED"

    await wait_until(taped, what="the tape to record the run")
    kinds = steps
    assert kinds.count("tool-start") == 1
    assert "tool-result" in kinds


async def test_a_call_a_policy_denies_is_an_error_with_the_denial_and_never_runs(world: World) -> None:
    async with mcp_client(world, ADA) as client:
        result = await client.call_tool("notes__drop_table", {"table": "users"})
    assert result.is_error
    assert text_of(result).startswith("Error: Tool drop_table denied by policy 'no-drops': ")
    assert meta_of(result)["atmosphere/code"] == ToolCallFailedError.code
    assert world.ran() == []


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_call_needing_approval_is_elicited_and_runs_once_approved(world: World, mode: str) -> None:
    approver = Approver(approve=True)
    async with mcp_client(world, ADA, mode=mode, approver=approver) as client:
        result = await client.call_tool("notes__delete_note", {"title": "groceries"})
    assert not result.is_error, text_of(result)
    assert text_of(result) == "deleted note 'groceries'"
    assert len(approver.asked) == 1
    assert "delete_note" in approver.asked[0]
    assert world.ran() == ["delete_note groceries"]


async def test_a_declined_approval_is_an_error_and_never_runs_the_tool(world: World) -> None:
    async with mcp_client(world, ADA, approver=Approver(approve=False)) as client:
        result = await client.call_tool("notes__delete_note", {"title": "groceries"})
    assert result.is_error
    assert text_of(result) == "Error: Action cancelled by user"
    assert world.ran() == []


async def test_a_client_that_cannot_elicit_is_told_at_once(world: World) -> None:
    async with mcp_client(world, ADA) as client:
        with anyio.fail_after(10):
            result = await client.call_tool("notes__delete_note", {"title": "groceries"})
    assert result.is_error
    assert "needs a human's approval" in text_of(result)
    assert world.ran() == []


@pytest.mark.parametrize("token", [CY_ECHO, BOB])
async def test_another_user_sees_and_calls_only_the_tools_of_agents_they_are_granted(world: World, token: str) -> None:
    async with mcp_client(world, token) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        result = await client.call_tool("notes__read_note", {"title": "groceries"})
    if token == CY_ECHO:
        assert names == {"echo"}
        assert result.is_error
        assert text_of(result) == "Error: Unknown tool 'notes__read_note'"
        assert world.ran() == []
    else:  # bob may use notes: his own run, not ada's
        assert names >= NOTES_TOOLS
        assert not result.is_error
        assert (await ended(world, meta_of(result)["atmosphere/runId"])).owner == "bob"


async def test_bad_arguments_are_clear_errors_and_nothing_runs(world: World) -> None:
    async with mcp_client(world, ADA) as client:
        missing = await client.call_tool("notes__read_note", {})
        wrong = await client.call_tool("notes__read_note", {"title": 42})
        unknown = await client.call_tool("notes__burn_note", {"title": "x"})
        too_large = await client.call_tool("notes__read_note", {"title": "x" * MESSAGE_LIMIT})
    assert missing.is_error
    assert text_of(missing) == "Error: Invalid arguments for the tool 'read_note': title: field required"
    assert wrong.is_error
    assert text_of(wrong) == "Error: Invalid arguments for the tool 'read_note': title: expected string, got int"
    assert unknown.is_error
    assert text_of(unknown) == "Error: Unknown tool 'notes__burn_note'"
    assert too_large.is_error
    assert text_of(too_large) == f"Error: The message exceeds {MESSAGE_LIMIT} bytes"
    assert world.ran() == []


async def test_pii_in_the_arguments_is_refused_before_the_tool_runs(world: World) -> None:
    async with mcp_client(world, ADA) as client:
        result = await client.call_tool("notes__read_note", {"title": f"mail {EMAIL}"})
    assert result.is_error
    assert "rewrote this tool call's input" in text_of(result)
    assert meta_of(result)["atmosphere/code"] == ToolCallRefusedError.code
    assert world.ran() == []


async def test_the_agents_are_still_tools_beside_them(world: World) -> None:
    async with mcp_client(world, ADA) as client:
        result = await client.call_tool("echo", {"message": "still here"})
    assert text_of(result) == "still here"


async def test_the_info_names_the_exposed_tools(world: World) -> None:
    async with httpx.AsyncClient(base_url=world.url, timeout=10) as http:
        info = (await http.get("/api/console/info", headers={"Authorization": f"Bearer {ADA}"})).json()
    assert info["mcp"]["appTools"] == ["*"]
