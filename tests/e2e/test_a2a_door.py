"""The A2A door, driven by the `a2a-sdk`'s own client against a real stack.

The Agent Card, a message sent and streamed, a task cancelled while it streams and resubscribed,
an approval as `input-required` answered by the next message, a second user, the limits, PII.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.helpers import get_artifact_text, get_message_text, new_text_message
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from google.protobuf.json_format import MessageToDict

from atmosphere.bus.runs import last_event
from atmosphere.testing import ToolCallScript, Turn, wait_until

from .doors_stack import ADA, ADA_ECHO, BOB, EMAIL, MESSAGE_LIMIT, World, doors_world

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    async with doors_world(nats_url, tmp_path_factory.mktemp("a2a-door")) as world:
        yield world


@pytest.fixture(autouse=True)
def fresh_script(world: World) -> Iterator[None]:
    with world.fresh():
        yield


def agent_url(world: World, agent: str) -> str:
    return f"{world.url}/atmosphere/a2a/{agent}"


@contextlib.asynccontextmanager
async def a2a_client(world: World, agent: str, token: str = ADA, *, streaming: bool = True) -> AsyncIterator[Client]:
    """The SDK's client for `agent`, made from its Agent Card."""
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        config = ClientConfig(streaming=streaming, httpx_client=http)
        client = await ClientFactory(config).create_from_url(agent_url(world, agent))
        async with client:
            yield client


def message(text: str, *, task_id: str = "", context_id: str = "") -> SendMessageRequest:
    sent = new_text_message(text, role=Role.ROLE_USER)
    if task_id:
        sent.task_id = task_id
    if context_id:
        sent.context_id = context_id
    return SendMessageRequest(message=sent)


async def test_each_agent_publishes_its_card(world: World) -> None:
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {ADA}"}, timeout=10) as http:
        card = await A2ACardResolver(http, base_url=agent_url(world, "notes")).get_agent_card()
        raw = (await http.get(f"{agent_url(world, 'notes')}/.well-known/agent-card.json")).json()
        root = await http.get(f"{world.url}/.well-known/agent-card.json")
    assert card.name == "notes"
    assert card.description == "Manages notes."
    assert card.capabilities.streaming
    assert [(i.protocol_binding, i.url) for i in card.supported_interfaces] == [("JSONRPC", agent_url(world, "notes"))]
    assert raw["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "bearer"
    assert root.json()["name"] == "echo"  # ATMOSPHERE_A2A__DEFAULT_AGENT


async def test_a_message_is_a_run_and_its_answer_an_artifact(world: World) -> None:
    async with a2a_client(world, "echo", streaming=False) as client:
        [reply] = [r async for r in client.send_message(message("hello brave new world"))]
    task = reply.task
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert get_artifact_text(task.artifacts[0]) == "hello brave new world"


async def test_a_streamed_message_sends_the_answer_in_chunks(world: World) -> None:
    async with a2a_client(world, "echo") as client:
        events = [e async for e in client.send_message(message("hello brave new world"))]
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds[0] == "task"
    updates = [e.artifact_update for e in events if e.HasField("artifact_update")]
    chunks = [get_artifact_text(u.artifact) for u in updates if u.append or u is updates[0]]
    assert "".join(chunks) == "hello brave new world"
    # Streamed, not sent whole: the first word at once, the rest as governance's output check
    # releases it (dispatch joins pieces released together: `TEXT_DELTA_WINDOW_MS`).
    assert len(chunks) >= 2
    whole = updates[-1]
    assert (whole.append, whole.last_chunk) == (False, True)
    assert get_artifact_text(whole.artifact) == "hello brave new world"
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED


async def test_a_task_is_resubscribed_and_cancelled_with_its_run(world: World) -> None:
    world.provider.script(Turn.text("thinking " * 60, chunk_delay=0.15))
    async with a2a_client(world, "notes") as client:
        task_id = ""
        async with contextlib.aclosing(client.send_message(message("think"))) as stream:
            async for event in stream:
                if event.HasField("task"):
                    task_id = event.task.id
                if event.HasField("artifact_update"):
                    break  # the stream is dropped; the task goes on
        assert task_id
        working = await client.get_task(GetTaskRequest(id=task_id))
        assert working.status.state == TaskState.TASK_STATE_WORKING
        run_id = MessageToDict(working.metadata)["atmosphere/runId"]
        seen: list[Any] = []

        async def resubscribe() -> None:
            async for event in client.subscribe(SubscribeToTaskRequest(id=task_id)):
                seen.append(event)

        following = asyncio.create_task(resubscribe())
        await wait_until(lambda: _truth(len(seen) >= 2), what="the resubscribed stream")
        assert seen[0].HasField("task")
        cancelled = await client.cancel_task(CancelTaskRequest(id=task_id))
        assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
        await asyncio.wait_for(following, 10)
    assert seen[-1].status_update.status.state == TaskState.TASK_STATE_CANCELED

    async def run_cancelled() -> bool:
        last = await last_event(world.bus, run_id)
        return last is not None and last.error.code == "run.cancelled"

    await wait_until(run_cancelled, what="the run to be cancelled")


async def _truth(value: bool) -> bool:
    return value


async def test_an_approval_is_input_required_and_the_next_message_answers_it(world: World) -> None:
    world.provider.script(
        Turn.tool_calls(ToolCallScript("delete_note", {"title": "groceries"})), Turn.text("Deleted it.")
    )
    async with a2a_client(world, "notes", streaming=False) as client:
        [asked] = [r async for r in client.send_message(message("delete my groceries note"))]
        task = asked.task
        assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        assert "delete_note" in get_message_text(task.status.message)
        assert world.ran() == []
        [done] = [r async for r in client.send_message(message("approve", task_id=task.id, context_id=task.context_id))]
    assert done.task.status.state == TaskState.TASK_STATE_COMPLETED
    assert get_artifact_text(done.task.artifacts[-1]) == "Deleted it."
    assert world.ran() == ["delete_note groceries"]


async def test_anything_but_approve_denies(world: World) -> None:
    world.provider.script(
        Turn.tool_calls(ToolCallScript("delete_note", {"title": "groceries"})), Turn.text("Not deleted.")
    )
    async with a2a_client(world, "notes", streaming=False) as client:
        [asked] = [r async for r in client.send_message(message("delete my groceries note"))]
        task = asked.task
        reply = message("well, maybe", task_id=task.id, context_id=task.context_id)
        [done] = [r async for r in client.send_message(reply)]
    assert done.task.status.state == TaskState.TASK_STATE_COMPLETED
    assert world.ran() == []


async def test_another_user_cannot_see_answer_or_cancel_a_task(world: World) -> None:
    world.provider.script(Turn.tool_calls(ToolCallScript("delete_note", {"title": "groceries"})), Turn.text("Done."))
    async with a2a_client(world, "notes", streaming=False) as ada:
        [asked] = [r async for r in ada.send_message(message("delete my groceries note"))]
        task = asked.task
        async with a2a_client(world, "notes", BOB, streaming=False) as bob:
            with pytest.raises(Exception, match=r"(?i)not found"):
                await bob.get_task(GetTaskRequest(id=task.id))
            with pytest.raises(Exception, match=r"(?i)not found"):
                await bob.cancel_task(CancelTaskRequest(id=task.id))
            answer = message("approve", task_id=task.id, context_id=task.context_id)
            with pytest.raises(Exception, match=r"(?i)not found"):
                [r async for r in bob.send_message(answer)]
        assert world.ran() == []
        [done] = [r async for r in ada.send_message(message("approve", task_id=task.id, context_id=task.context_id))]
    assert done.task.status.state == TaskState.TASK_STATE_COMPLETED
    assert world.ran() == ["delete_note groceries"]


@pytest.mark.parametrize(
    ("token", "agent", "status"), [("", "echo", 401), (ADA_ECHO, "notes", 403), (ADA, "nobody", 404)]
)
async def test_refusals_are_http_errors_before_any_task(world: World, token: str, agent: str, status: int) -> None:
    headers = {"A2A-Version": "1.0"} | ({"Authorization": f"Bearer {token}"} if token else {})
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}},
    }
    async with httpx.AsyncClient(timeout=10) as http:
        sent = await http.post(agent_url(world, agent), json=body, headers=headers)
        card = await http.get(f"{agent_url(world, agent)}/.well-known/agent-card.json", headers=headers)
    assert (sent.status_code, card.status_code) == (status, status)


async def test_the_largest_message_is_served_and_one_byte_more_is_refused(world: World) -> None:
    async with a2a_client(world, "echo", streaming=False) as client:
        [served] = [r async for r in client.send_message(message("é" * (MESSAGE_LIMIT // 2)))]
        [over] = [r async for r in client.send_message(message("é" * (MESSAGE_LIMIT // 2) + "x"))]
    assert get_artifact_text(served.task.artifacts[0]) == "é" * (MESSAGE_LIMIT // 2)
    assert over.task.status.state == TaskState.TASK_STATE_REJECTED
    assert get_message_text(over.task.status.message) == f"Error: The message exceeds {MESSAGE_LIMIT} bytes"


async def test_a_body_past_what_any_message_needs_is_a_413_before_the_sdk_reads_it(world: World) -> None:
    huge = b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"pad": "' + b"x" * (
        7 * MESSAGE_LIMIT + 65536
    )
    headers = {"Authorization": f"Bearer {ADA}", "A2A-Version": "1.0", "Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=30) as http:
        refused = await http.post(agent_url(world, "echo"), content=huge + b'"}}', headers=headers)
    assert refused.status_code == 413
    assert refused.json()["code"] == "ingress.too_large"


async def test_a_message_without_text_is_rejected(world: World) -> None:
    empty = SendMessageRequest(message=new_text_message("   ", role=Role.ROLE_USER))
    async with a2a_client(world, "echo", streaming=False) as client:
        [reply] = [r async for r in client.send_message(empty)]
    assert reply.task.status.state == TaskState.TASK_STATE_REJECTED
    assert get_message_text(reply.task.status.message) == "Error: The message has no text (only text parts are read)"


async def test_an_email_never_reaches_the_a2a_client(world: World) -> None:
    leaky = "Here is the account summary you asked for. " * 6 + f"Contact {EMAIL} for refunds. " + "Thanks. " * 30
    world.provider.script(Turn.text(leaky, words=False))
    async with a2a_client(world, "notes") as client:
        events = [e async for e in client.send_message(message("summarise"))]
    assert all(EMAIL not in str(e) for e in events)
    final = events[-1].status_update.status
    assert final.state == TaskState.TASK_STATE_FAILED
    assert get_message_text(final.message) == "Error: Response blocked: response contains PII of kinds: [email]"


async def test_the_run_is_the_callers_and_the_info_lists_the_door(world: World) -> None:
    async with a2a_client(world, "echo", streaming=False) as client:
        [reply] = [r async for r in client.send_message(message("mine"))]
    run_id = MessageToDict(reply.task.metadata)["atmosphere/runId"]
    last = await last_event(world.bus, run_id)
    assert last is not None
    assert last.owner == "ada"
    async with httpx.AsyncClient(base_url=world.url, timeout=10) as http:
        stranger = await http.get(f"/atmosphere/runs/{run_id}/events", headers={"Authorization": f"Bearer {BOB}"})
        info = (await http.get("/api/console/info", headers={"Authorization": f"Bearer {ADA}"})).json()
    assert stranger.status_code == 404
    assert info["a2a"] == {
        "path": "/atmosphere/a2a/{agent}",
        "agentCard": "/atmosphere/a2a/{agent}/.well-known/agent-card.json",
        "protocolVersions": ["1.0", "0.3"],
        "defaultAgent": "echo",
    }
