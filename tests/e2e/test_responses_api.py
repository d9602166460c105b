"""The OpenAI Responses API, driven by the official `openai` client against a real stack.

Streamed and not, a conversation continued by `previous_response_id` (its instructions each
response's own; refused for another user), a chat completion's conversation kept by its client
alone, what is not supported said at once, an approval refused at once, PII kept out, the limit.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import openai
import pytest
import pytest_asyncio
from nats.aio.msg import Msg

from atmosphere.bus import subjects
from atmosphere.bus.runs import last_event
from atmosphere.testing import ToolCallScript, Turn

from .doors_stack import ADA, BOB, EMAIL, MESSAGE_LIMIT, World, doors_world

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    async with doors_world(nats_url, tmp_path_factory.mktemp("responses")) as world:
        yield world


@pytest_asyncio.fixture(autouse=True, loop_scope="module")
async def fresh_script(world: World) -> AsyncIterator[None]:
    with world.fresh():
        yield
    await world.close_clients()


async def test_a_response_is_a_run_of_the_agent(world: World) -> None:
    response = await world.openai().responses.create(model="echo", input="hello brave new world")
    assert response.output_text == "hello brave new world"
    assert response.status == "completed"
    assert response.id.startswith("resp_")
    last = await last_event(world.bus, response.id.removeprefix("resp_"))
    assert last is not None
    assert (last.owner, last.agent) == ("ada", "echo")


async def test_a_streamed_response_sends_the_documented_events(world: World) -> None:
    world.provider.script(Turn.text("Bonjour tout le monde", usage=(7, 4)))
    stream = await world.openai().responses.create(model="keeper", input="Say hello in French", stream=True)
    events = [event async for event in stream]
    types = [event.type for event in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Bonjour tout le monde"
    assert [e.sequence_number for e in events] == list(range(1, len(events) + 1))
    completed = events[-1].response
    assert completed.output_text == "Bonjour tout le monde"
    assert completed.usage is not None
    assert (completed.usage.input_tokens, completed.usage.output_tokens) == (7, 4)


async def test_previous_response_id_continues_the_conversation(world: World) -> None:
    world.provider.script(Turn.text("Nice to meet you, Ada."), Turn.text("Your name is Ada."))
    first = await world.openai().responses.create(model="keeper", input="My name is Ada.")
    second = await world.openai().responses.create(
        model="keeper", input="What is my name?", previous_response_id=first.id
    )
    assert second.output_text == "Your name is Ada."
    assert second.previous_response_id == first.id
    told = world.provider.requests[-1]["messages"]
    assert {"role": "user", "content": "My name is Ada."} in told
    assert {"role": "assistant", "content": "Nice to meet you, Ada."} in told


async def test_instructions_and_earlier_items_keep_the_conversation(world: World) -> None:
    # An SDK sends `instructions` with every response (the OpenAI Agents SDK does): they are that
    # response's, while the conversation stays memory's.
    world.provider.script(Turn.text("Nice to meet you, Ada."), Turn.text("Ada."), Turn.text("Still Ada."))
    first = await world.openai().responses.create(model="keeper", input="My name is Ada.", instructions="Be brief.")
    second = await world.openai().responses.create(
        model="keeper",
        input=[{"role": "user", "content": "Answer in one word."}, {"role": "user", "content": "What is my name?"}],
        instructions="Be terse.",
        previous_response_id=first.id,
    )
    told = world.provider.requests[-1]["messages"]
    assert {"role": "user", "content": "My name is Ada."} in told
    assert {"role": "assistant", "content": "Nice to meet you, Ada."} in told
    assert {"role": "user", "content": "Answer in one word."} in told
    assert not any("Be brief." in str(m["content"]) for m in told)  # the first response's instructions stay its own
    assert "Be terse." in str(told)
    await world.openai().responses.create(model="keeper", input="And now?", previous_response_id=second.id)
    told = world.provider.requests[-1]["messages"]
    assert {"role": "user", "content": "What is my name?"} in told
    assert {"role": "assistant", "content": "Ada."} in told
    assert not any("Be terse." in str(m["content"]) for m in told)


async def test_a_chat_completion_is_the_clients_conversation_and_never_reaches_memory(world: World) -> None:
    asked: list[str] = []

    async def note(msg: Msg) -> None:
        asked.append(msg.subject)

    observer = await world.bus.client.subscribe(world.bus.wire_subject(f"{subjects.ROOT}.mem.>"), cb=note)
    try:
        await world.bus.client.flush()
        world.provider.script(Turn.text("Hello."), Turn.text("You are Ada."))
        await world.openai().chat.completions.create(model="keeper", messages=[{"role": "user", "content": "Hi"}])
        earlier = [
            {"role": "user", "content": "My name is Ada."},
            {"role": "assistant", "content": "Hello Ada."},
            {"role": "user", "content": "Who am I?"},
        ]
        answer = await world.openai().chat.completions.create(model="keeper", messages=earlier)
        await world.bus.client.flush()
    finally:
        await observer.unsubscribe()
    assert answer.choices[0].message.content == "You are Ada."
    told = world.provider.requests[-1]["messages"]
    assert [m for m in told if m["role"] != "system"] == earlier
    # Nothing loaded under a key made for one request, nothing left behind under it.
    assert not [subject for subject in asked if ".mem.history" in subject or ".mem.tool" in subject], asked


async def test_another_users_response_cannot_be_continued(world: World) -> None:
    world.provider.script(Turn.text("Noted."))
    adas = await world.openai().responses.create(model="keeper", input="My PIN is 1234.")
    with pytest.raises(openai.NotFoundError) as refused:
        await world.openai(BOB).responses.create(model="keeper", input="What is my PIN?", previous_response_id=adas.id)
    assert refused.value.code == "not_found"
    with pytest.raises(openai.BadRequestError):
        await world.openai().responses.create(model="echo", input="hi", previous_response_id=adas.id)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"background": True}, "background"),
    ],
)
async def test_what_is_not_supported_is_refused_at_once(world: World, extra: dict[str, object], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await world.openai().responses.create(model="echo", input="hi", **extra)  # type: ignore[call-overload]
    assert refused.value.code == "unsupported_parameter"
    assert refused.value.param == param


async def test_an_approval_is_refused_at_once_and_the_tool_never_runs(world: World) -> None:
    world.provider.script(Turn.tool_calls(ToolCallScript("delete_note", {"title": "groceries"})))
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        await world.openai().responses.create(model="notes", input="delete my groceries note")
    assert refused.value.code == "approval_required"
    assert world.ran() == []


async def test_an_email_never_reaches_a_responses_client(world: World) -> None:
    leaky = "Here is the account summary you asked for. " * 6 + f"Contact {EMAIL} for refunds. " + "Thanks. " * 30
    world.provider.script(Turn.text(leaky, words=False), Turn.text(leaky, words=False))
    with pytest.raises(openai.PermissionDeniedError) as blocked:
        await world.openai().responses.create(model="notes", input="summarise")
    assert EMAIL not in str(blocked.value.body)
    stream = await world.openai().responses.create(model="notes", input="summarise", stream=True)
    events = [event async for event in stream]
    assert all(EMAIL not in event.model_dump_json() for event in events)
    assert events[-1].type == "response.failed"
    assert events[-1].response.error.message == "Response blocked: response contains PII of kinds: [email]"


async def test_the_largest_body_is_served_and_one_byte_more_is_a_413(world: World) -> None:
    def body(size: int) -> bytes:
        skeleton = json.dumps({"model": "echo", "input": ""}).encode()
        return json.dumps({"model": "echo", "input": "x" * (size - len(skeleton))}).encode()

    headers = {"Authorization": f"Bearer {ADA}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=world.url, timeout=30, headers=headers) as http:
        served = await http.post("/atmosphere/v1/responses", content=body(MESSAGE_LIMIT))
        over = await http.post("/atmosphere/v1/responses", content=body(MESSAGE_LIMIT + 1))
    assert served.status_code == 200
    assert len(served.json()["output"][0]["content"][0]["text"]) > MESSAGE_LIMIT - 100
    assert over.status_code == 413
    assert over.json()["error"]["type"] == "invalid_request_error"


async def test_a_malformed_previous_response_id_is_a_400(world: World) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await world.openai().responses.create(model="echo", input="hi", previous_response_id="resp_../../x")
    assert refused.value.param == "previous_response_id"
