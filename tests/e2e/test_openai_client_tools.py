"""Chat Completions as a governed model gateway, driven by clients nobody here wrote.

The client's own `tools` are offered to the model beside the agent's; the model's calls of them
come back as `tool_calls` (never run here), each first checked at the tool choke point (a
policy's denial goes back to the model instead); the client's `tool` messages continue the
exchange; a JSON `response_format` is asked of the model as sent. The official `openai` client,
LangChain's `bind_tools` and `with_structured_output`, and a PydanticAI agent with its own tool
work against the endpoint unchanged.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool as langchain_tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from atmosphere.testing import ToolCallScript, Turn

from .doors_stack import ADA, BOB, MESSAGE_LIMIT, World, doors_world

pytestmark = pytest.mark.asyncio(loop_scope="module")

LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Search the client's catalogue.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    },
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    async with doors_world(nats_url, tmp_path_factory.mktemp("client-tools")) as world:
        yield world


@pytest_asyncio.fixture(autouse=True, loop_scope="module")
async def fresh_script(world: World) -> AsyncIterator[None]:
    with world.fresh():
        yield
    await world.close_clients()


def chat_model(world: World) -> ChatOpenAI:
    """LangChain's model on the stack, over a client of ours (so it is closed after the test)."""
    return ChatOpenAI(
        model="keeper",
        base_url=f"{world.url}/atmosphere/v1",
        api_key=ADA,
        max_retries=0,
        http_async_client=world.http(),
    )


def tool_turns(request: dict[str, Any]) -> list[dict[str, Any]]:
    """What the provider was sent after the user's message: the calls and their results."""
    messages = request["messages"]
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    return messages[last_user + 1 :]


async def test_a_client_tool_call_round_trips_with_the_official_client(world: World) -> None:
    world.provider.script(
        Turn.tool_calls(ToolCallScript("lookup", {"q": "atlas"}, call_id="call_a"), text="Looking."),
        Turn.text("Atlas is a book of maps."),
    )
    asked = [{"role": "user", "content": "What is atlas?"}]
    first = await world.openai().chat.completions.create(
        model="keeper", messages=asked, tools=[LOOKUP], tool_choice="auto"
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == ("call_a", "lookup", {"q": "atlas"})
    sent = world.provider.requests[0]
    assert [t["function"]["name"] for t in sent["tools"]] == ["lookup"]
    assert sent["tool_choice"] == "auto"
    assert world.ran() == []  # nothing of the client's runs here

    second = await world.openai().chat.completions.create(
        model="keeper",
        tools=[LOOKUP],
        messages=[
            *asked,
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": "call_a", "content": "Atlas: a book of maps"},
        ],
    )
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "Atlas is a book of maps."
    assert tool_turns(world.provider.requests[1]) == [
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "atlas"}'}}
            ],
        },
        {"role": "tool", "content": "Atlas: a book of maps", "tool_call_id": "call_a"},
    ]


async def test_streamed_tool_calls_arrive_as_chunks(world: World) -> None:
    world.provider.script(
        Turn.tool_calls(
            ToolCallScript("lookup", {"q": "atlas"}, call_id="call_a"),
            ToolCallScript("lookup", {"q": "globe"}, call_id="call_b"),
        )
    )
    stream = await world.openai().chat.completions.create(
        model="keeper", messages=[{"role": "user", "content": "Both?"}], tools=[LOOKUP], stream=True
    )
    chunks = [chunk async for chunk in stream]
    calls = [c for chunk in chunks for c in chunk.choices[0].delta.tool_calls or ()]
    assert [(c.index, c.id, c.function.name, c.function.arguments) for c in calls] == [  # type: ignore[union-attr]
        (0, "call_a", "lookup", '{"q": "atlas"}'),
        (1, "call_b", "lookup", '{"q": "globe"}'),
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_a_client_tool_denied_by_policy_goes_back_to_the_model(world: World) -> None:
    drop = {"type": "function", "function": {"name": "drop_everything", "parameters": {"type": "object"}}}
    world.provider.script(
        Turn.tool_calls(ToolCallScript("drop_everything", {}, call_id="call_d")),
        Turn.text("I am not allowed to do that."),
    )
    answer = await world.openai().chat.completions.create(
        model="keeper", messages=[{"role": "user", "content": "Drop it all"}], tools=[drop]
    )
    assert answer.choices[0].finish_reason == "stop"
    assert not answer.choices[0].message.tool_calls
    assert answer.choices[0].message.content == "I am not allowed to do that."
    [refusal] = tool_turns(world.provider.requests[1])[1:]
    assert refusal["tool_call_id"] == "call_d"
    assert "no-drops" in refusal["content"]


async def test_the_agents_own_tools_still_run_here(world: World) -> None:
    world.provider.script(
        Turn.tool_calls(ToolCallScript("read_note", {"title": "shopping"}, call_id="call_r")),
        Turn.tool_calls(ToolCallScript("lookup", {"q": "milk"}, call_id="call_l")),
    )
    answer = await world.openai().chat.completions.create(
        model="notes", messages=[{"role": "user", "content": "Read my note, then look up milk"}], tools=[LOOKUP]
    )
    assert world.ran() == ["read_note shopping"]
    [call] = answer.choices[0].message.tool_calls or []
    assert call.function.name == "lookup"


async def test_a_function_named_as_an_agents_tool_is_refused(world: World) -> None:
    clash = {"type": "function", "function": {"name": "read_note", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError) as refused:
        await world.openai().chat.completions.create(
            model="notes", messages=[{"role": "user", "content": "hi"}], tools=[clash]
        )
    assert "has the name of one of the agent's own tools" in str(refused.value)
    assert world.provider.requests == []


async def test_langchain_bind_tools_gets_the_models_call(world: World) -> None:
    @langchain_tool
    def lookup(q: str) -> str:
        """Search the client's catalogue."""
        return f"{q}: a book of maps"

    world.provider.script(
        Turn.tool_calls(ToolCallScript("lookup", {"q": "atlas"}, call_id="call_lc")),
        Turn.text("Atlas: a book of maps."),
    )
    model = chat_model(world)
    bound = model.bind_tools([lookup])
    question = HumanMessage("What is atlas?")
    asked = await bound.ainvoke([question])
    assert [(c["name"], c["args"], c["id"]) for c in asked.tool_calls] == [("lookup", {"q": "atlas"}, "call_lc")]
    result = ToolMessage(lookup.invoke(asked.tool_calls[0]["args"]), tool_call_id="call_lc")
    answered = await bound.ainvoke([question, asked, result])
    assert answered.content == "Atlas: a book of maps."


class Book(BaseModel):
    title: str
    pages: int


async def test_langchain_with_structured_output_gets_its_schema_honoured(world: World) -> None:
    world.provider.script(Turn.text('{"title": "Atlas", "pages": 120}'))
    model = chat_model(world)
    book = await model.with_structured_output(Book).ainvoke("Describe the atlas")
    assert book == Book(title="Atlas", pages=120)
    asked = world.provider.requests[0]["response_format"]
    assert asked["type"] == "json_schema"
    assert asked["json_schema"]["name"] == "Book"
    assert set(asked["json_schema"]["schema"]["properties"]) == {"title", "pages"}


async def test_a_pydantic_ai_agent_with_its_own_tool_works_unchanged(world: World) -> None:
    provider = OpenAIProvider(openai_client=world.openai())
    agent = Agent(OpenAIChatModel("keeper", provider=provider), instructions="Use lookup.")
    looked_up: list[str] = []

    @agent.tool_plain
    def lookup(q: str) -> str:
        """Search the catalogue."""
        looked_up.append(q)
        return f"{q}: a book of maps"

    world.provider.script(
        Turn.tool_calls(ToolCallScript("lookup", {"q": "atlas"}, call_id="call_p")),
        Turn.text("Atlas is a book of maps."),
    )
    result = await agent.run("What is atlas?")
    assert result.output == "Atlas is a book of maps."
    assert looked_up == ["atlas"]
    [_, answered] = tool_turns(world.provider.requests[1])
    assert answered == {"role": "tool", "content": "atlas: a book of maps", "tool_call_id": "call_p"}


# -- the Responses API's function tools ---------------------------------------------------------

FUNCTION = {
    "type": "function",
    "name": "lookup",
    "description": "Search the client's catalogue.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
}


async def test_a_response_hands_its_function_call_back_and_continues_after_it(world: World) -> None:
    world.provider.script(
        Turn.tool_calls(ToolCallScript("lookup", {"q": "atlas"}, call_id="call_r")),
        Turn.text("Atlas is a book of maps."),
    )
    first = await world.openai().responses.create(model="keeper", input="What is atlas?", tools=[FUNCTION])
    [call] = [item for item in first.output if item.type == "function_call"]
    assert (call.call_id, call.name, json.loads(call.arguments)) == ("call_r", "lookup", {"q": "atlas"})
    assert world.ran() == []

    outputs = [{"type": "function_call_output", "call_id": "call_r", "output": "Atlas: a book of maps"}]
    with pytest.raises(openai.NotFoundError):  # another user's response: as if it did not exist
        await world.openai(BOB).responses.create(
            model="keeper", previous_response_id=first.id, tools=[FUNCTION], input=outputs
        )
    second = await world.openai().responses.create(
        model="keeper",
        previous_response_id=first.id,
        tools=[FUNCTION],
        input=[{"type": "function_call_output", "call_id": "call_r", "output": "Atlas: a book of maps"}],
    )
    assert second.output_text == "Atlas is a book of maps."
    continued = world.provider.requests[1]["messages"]
    # The question once (the handed-back turn is not stored as over), then the call and its output.
    assert [m["content"] for m in continued if m["role"] == "user"] == ["What is atlas?"]
    assert tool_turns(world.provider.requests[1]) == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_r", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "atlas"}'}}
            ],
        },
        {"role": "tool", "content": "Atlas: a book of maps", "tool_call_id": "call_r"},
    ]


async def test_outputs_answering_no_call_of_the_previous_response_are_refused(world: World) -> None:
    world.provider.script(Turn.text("Nothing to call."))
    first = await world.openai().responses.create(model="keeper", input="Hello", tools=[FUNCTION])
    with pytest.raises(openai.BadRequestError) as refused:
        await world.openai().responses.create(
            model="keeper",
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": "call_x", "output": "?"}],
        )
    assert "made no function calls" in str(refused.value)


async def test_a_streamed_response_announces_its_function_call(world: World) -> None:
    world.provider.script(Turn.tool_calls(ToolCallScript("lookup", {"q": "globe"}, call_id="call_s")))
    stream = await world.openai().responses.create(model="keeper", input="Globe?", tools=[FUNCTION], stream=True)
    events = [event async for event in stream]
    done = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    assert done == ['{"q": "globe"}']
    completed = events[-1]
    assert completed.type == "response.completed"
    [call] = [item for item in completed.response.output if item.type == "function_call"]
    assert call.call_id == "call_s"


async def test_a_whole_exchange_in_the_input_needs_no_previous_response(world: World) -> None:
    world.provider.script(Turn.text('{"title": "Atlas"}'))
    answer = await world.openai().responses.create(
        model="keeper",
        tools=[FUNCTION],
        text={"format": {"type": "json_schema", "name": "book", "schema": {"type": "object"}}},
        input=[
            {"role": "user", "content": "Which book?"},
            {"type": "function_call", "call_id": "call_w", "name": "lookup", "arguments": '{"q": "book"}'},
            {"type": "function_call_output", "call_id": "call_w", "output": "Atlas"},
        ],
    )
    assert answer.output_text == '{"title": "Atlas"}'
    sent = world.provider.requests[0]
    assert sent["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "book", "schema": {"type": "object"}},
    }
    assert tool_turns(sent)[1] == {"role": "tool", "content": "Atlas", "tool_call_id": "call_w"}


async def test_an_earlier_exchange_in_the_history_keeps_its_calls_on_an_agent_with_memory(world: World) -> None:
    world.provider.script(Turn.text("Globe: a ball of maps."))
    await world.openai().chat.completions.create(
        model="keeper",
        tools=[LOOKUP],
        messages=[
            {"role": "user", "content": "What is atlas?"},
            {"role": "assistant", "content": None, "tool_calls": [dict(CALL)]},
            {"role": "tool", "tool_call_id": "call_h", "content": "Atlas: maps"},
            {"role": "assistant", "content": "A book of maps."},
            {"role": "user", "content": "And globe?"},
        ],
    )
    sent = world.provider.requests[0]["messages"]
    [called] = [m for m in sent if m.get("tool_calls")]
    assert called["tool_calls"][0]["id"] == "call_h"
    assert {"role": "tool", "content": "Atlas: maps", "tool_call_id": "call_h"} in sent
    assert sent[-1] == {"role": "user", "content": "And globe?"}


CALL = {"id": "call_h", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "atlas"}'}}


@pytest.mark.parametrize("wire", ["responses", "chat_completions"])
async def test_an_openai_agents_sdk_agent_with_its_own_tool_works_unchanged(world: World, wire: str) -> None:
    from agents import Agent as OpenAIAgent
    from agents import OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    looked_up: list[str] = []

    @function_tool
    def lookup(q: str) -> str:
        """Search the catalogue."""
        looked_up.append(q)
        return f"{q}: a book of maps"

    model_class = OpenAIResponsesModel if wire == "responses" else OpenAIChatCompletionsModel
    agent = OpenAIAgent(
        name="client", instructions="Use lookup.", tools=[lookup], model=model_class("keeper", world.openai())
    )
    world.provider.script(
        Turn.tool_calls(ToolCallScript("lookup", {"q": "atlas"}, call_id="call_oa")),
        Turn.text("Atlas is a book of maps."),
    )
    result = await Runner.run(agent, "What is atlas?")
    assert result.final_output == "Atlas is a book of maps."
    assert looked_up == ["atlas"]
    assert tool_turns(world.provider.requests[1])[-1] == {
        "role": "tool",
        "content": "atlas: a book of maps",
        "tool_call_id": "call_oa",
    }


async def test_the_largest_body_with_tools_is_served_and_one_byte_more_is_a_413(world: World) -> None:
    # The bulk is a function's description: it travels in the run's gateway metadata, not its message.
    def body(size: int) -> bytes:
        def shaped(description: str) -> bytes:
            function = {**LOOKUP["function"], "description": description}  # type: ignore[dict-item]
            asked = {"model": "keeper", "messages": [{"role": "user", "content": "hi"}]}
            return json.dumps({**asked, "tools": [{"type": "function", "function": function}]}).encode()

        return shaped("x" * (size - len(shaped(""))))

    world.provider.script(Turn.tool_calls(ToolCallScript("lookup", {"q": "hi"}, call_id="call_big")))
    headers = {"Authorization": f"Bearer {ADA}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=world.url, timeout=30, headers=headers) as http:
        served = await http.post("/atmosphere/v1/chat/completions", content=body(MESSAGE_LIMIT))
        over = await http.post("/atmosphere/v1/chat/completions", content=body(MESSAGE_LIMIT + 1))
    assert len(body(MESSAGE_LIMIT)) == MESSAGE_LIMIT
    assert served.status_code == 200
    assert served.json()["choices"][0]["finish_reason"] == "tool_calls"
    assert len(world.provider.requests[0]["tools"][0]["function"]["description"]) > MESSAGE_LIMIT - 300
    assert over.status_code == 413
    assert over.json()["error"]["type"] == "invalid_request_error"
