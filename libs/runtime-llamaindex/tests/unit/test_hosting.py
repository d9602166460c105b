"""Hosting a user's own LlamaIndex agent or `AgentWorkflow`: its tools pass the choke point, its answer streams."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable

import pytest
from llama_index.core.agent.workflow import AgentWorkflow, BaseWorkflowAgent, FunctionAgent, ReActAgent
from llama_index.core.settings import Settings
from llama_index.llms.openai_like import OpenAILike  # type: ignore[import-untyped]  # ships no py.typed
from openai import AsyncOpenAI

from atmosphere.runtimes.llamaindex import LlamaIndexAgentRuntime
from atmosphere.sdk import AiRequest, ChatMessage
from atmosphere.sdk.runtime import RuntimeConfig, ToolCallRequest, ToolRunner, ToolSpec
from atmosphere.testing.model_turns import ToolCallScript, Turn
from atmosphere.testing.runtime_contract import Recorder, context
from atmosphere.testing.scripted_model import ScriptedModel

# Building a LlamaIndex agent reads pydantic's deprecated attributes (its workflow collects its steps
# with `inspect.getmembers`); the runtime builds its own quietly, these tests build the user's.
# A ReAct agent asks its context `is_running` inside a step, which LlamaIndex's workflows deprecate.
pytestmark = [
    pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecationWarning"),
    pytest.mark.filterwarnings("ignore:is_running called from within a step:DeprecationWarning"),
]

Hosted = BaseWorkflowAgent | AgentWorkflow


@pytest.fixture
async def own_client(fake_provider: ScriptedModel) -> AsyncIterator[AsyncOpenAI]:
    """The client of the agents' own LLMs (closed after the test: nothing else closes an LLM's client)."""
    client = AsyncOpenAI(base_url=fake_provider.base_url, api_key="own-key")
    yield client
    await client.close()


def own_llm(client: AsyncOpenAI, model: str = "own-model", **options: object) -> OpenAILike:
    """An LLM of the agent's own, at the scripted provider, reporting usage when it streams."""
    return OpenAILike(
        model=model,
        api_base=str(client.base_url),
        api_key=client.api_key,
        async_openai_client=client,
        is_chat_model=True,
        is_function_calling_model=True,
        additional_kwargs={"stream_options": {"include_usage": True}},
        **options,
    )


def weather_tool(ran: list[str]) -> Callable[[str], str]:
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        ran.append(city)
        return f"sunny in {city}"

    return get_weather


def weather_agent(client: AsyncOpenAI, ran: list[str], **options: object) -> FunctionAgent:
    """A real LlamaIndex agent with a real function tool, on an LLM of its own."""
    return FunctionAgent(
        name="weather",
        description="Reports the weather.",
        system_prompt="You report the weather.",
        tools=[weather_tool(ran)],
        llm=own_llm(client),
        **options,  # type: ignore[arg-type]
    )


def runtime_for(provider: ScriptedModel) -> LlamaIndexAgentRuntime:
    return LlamaIndexAgentRuntime(RuntimeConfig(base_url=provider.base_url, model="fake-model", stall_timeout=5.0))


async def host(
    provider: ScriptedModel,
    native: Hosted,
    recorder: Recorder,
    run_tool: ToolRunner,
    request: AiRequest | None = None,
) -> None:
    runtime = runtime_for(provider)
    try:
        ctx = context(recorder, request or AiRequest(message="Weather in Paris?"), native=native, run_tool=run_tool)
        await runtime.execute(ctx, recorder.session)
    finally:
        await runtime.aclose()


def through_local(recorder: Recorder) -> ToolRunner:
    """A choke point that lets every call through to the tool (`local`), recording it and what was sent before."""

    async def run_tool(call: ToolCallRequest) -> str:
        recorder.tool_calls.append(call)
        recorder.events.append(recorder.events[0].__class__())  # a marker: where in the stream the call ran
        assert call.local is not None
        return await call.local(call.arguments_json)

    return run_tool


def refusing(recorder: Recorder) -> ToolRunner:
    """A choke point whose gates refuse every call: `local` is never called."""

    async def run_tool(call: ToolCallRequest) -> str:
        recorder.tool_calls.append(call)
        return "Error: denied"

    return run_tool


def usages(recorder: Recorder) -> list[tuple[int, int, int, str]]:
    return [
        (e.usage.input_tokens, e.usage.output_tokens, e.usage.total_tokens, e.usage.model)
        for e in recorder.events
        if e.WhichOneof("kind") == "usage"
    ]


def test_llamaindex_agents_and_workflows_are_hosted(fake_provider: ScriptedModel, own_client: AsyncOpenAI) -> None:
    ran: list[str] = []
    weather = weather_agent(own_client, ran)

    def get_time(city: str) -> str:
        """Local time in a city."""
        return f"noon in {city}"

    clock = ReActAgent(name="clock", description="Tells the time.", tools=[get_time], llm=own_llm(own_client))
    workflow = AgentWorkflow(agents=[weather, clock], root_agent="weather")
    assert LlamaIndexAgentRuntime.hosts(weather)
    assert LlamaIndexAgentRuntime.hosts(clock)
    assert LlamaIndexAgentRuntime.hosts(workflow)
    assert not LlamaIndexAgentRuntime.hosts(object())
    runtime = runtime_for(fake_provider)
    assert runtime.native_tools(object()) == ()
    # Every tool of every agent, as LlamaIndex describes it to the model (signatures as this module annotates).
    assert runtime.native_tools(workflow) == (
        ToolSpec(
            name="get_weather",
            description="get_weather(city: 'str') -> 'str'\nCurrent weather for a city.",
            parameters={
                "type": "object",
                "properties": {"city": {"title": "City", "type": "string"}},
                "required": ["city"],
            },
        ),
        ToolSpec(
            name="get_time",
            description="get_time(city: 'str') -> 'str'\nLocal time in a city.",
            parameters={
                "type": "object",
                "properties": {"city": {"title": "City", "type": "string"}},
                "required": ["city"],
            },
        ),
    )


async def test_the_agents_tool_runs_only_through_the_choke_point(
    fake_provider: ScriptedModel, own_client: AsyncOpenAI
) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "Paris"}, call_id="call_p"), usage=(10, 5)),
        Turn.text("It is sunny in Paris.", usage=(20, 7)),
    )
    ran: list[str] = []
    recorder = Recorder()
    await host(fake_provider, weather_agent(own_client, ran), recorder, through_local(recorder))
    [call] = recorder.tool_calls
    assert (call.call_id, call.name, json.loads(call.arguments_json)) == ("call_p", "get_weather", {"city": "Paris"})
    assert ran == ["Paris"]
    first, second = fake_provider.requests
    assert first["model"] == "own-model"
    assert first["messages"][0] == {"role": "system", "content": "You report the weather."}
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_p", "content": "sunny in Paris"}
    assert recorder.text() == "It is sunny in Paris."
    # One report per model round, as the built-in runtime makes them; the round's argument deltas and
    # usage reach the client before its tool call runs (the marker).
    assert usages(recorder) == [(10, 5, 15, "own-model"), (20, 7, 27, "own-model")]
    kinds = recorder.kinds()
    assert kinds.index("tool_call_delta") < kinds.index("usage") < kinds.index("")
    assert kinds[-2:] == ["usage", "complete"]


async def test_a_refused_call_never_runs_the_tool(fake_provider: ScriptedModel, own_client: AsyncOpenAI) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "Paris"}, call_id="call_p")),
        Turn.text("I may not look."),
    )
    ran: list[str] = []
    recorder = Recorder()
    await host(fake_provider, weather_agent(own_client, ran), recorder, refusing(recorder))
    assert [c.name for c in recorder.tool_calls] == ["get_weather"]
    assert ran == []
    assert fake_provider.requests[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_p",
        "content": "Error: denied",
    }
    assert recorder.text() == "I may not look."
    assert recorder.terminal().WhichOneof("kind") == "complete"


async def test_a_workflow_hands_off_between_its_agents(fake_provider: ScriptedModel, own_client: AsyncOpenAI) -> None:
    fake_provider.script(
        Turn.tool_calls(
            ToolCallScript("handoff", {"to_agent": "weather", "reason": "a weather question"}, call_id="call_h"),
            usage=(30, 4),
        ),
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "Paris"}, call_id="call_w"), usage=(40, 6)),
        Turn.text("Sunny in Paris.", usage=(50, 8)),
    )
    ran: list[str] = []
    triage = FunctionAgent(
        name="triage",
        description="Sends each question to the agent that knows.",
        system_prompt="You route questions.",
        can_handoff_to=["weather"],
        llm=own_llm(own_client),
    )
    workflow = AgentWorkflow(agents=[triage, weather_agent(own_client, ran)], root_agent="triage")
    recorder = Recorder()
    await host(fake_provider, workflow, recorder, through_local(recorder))
    # The handoff is LlamaIndex's control flow: it runs as it is; the agent's tool passes the choke point.
    assert [(c.call_id, c.name) for c in recorder.tool_calls] == [("call_w", "get_weather")]
    assert ran == ["Paris"]
    first, second, _ = fake_provider.requests
    assert first["messages"][0] == {"role": "system", "content": "You route questions."}
    assert [t["function"]["name"] for t in first["tools"]] == ["handoff"]
    assert second["messages"][0] == {"role": "system", "content": "You report the weather."}
    [handoff] = [e.handoff for e in recorder.events if e.WhichOneof("kind") == "handoff"]
    assert (handoff.from_agent, handoff.to_agent, handoff.reason) == ("triage", "weather", "a weather question")
    # The handoff's arguments are no tool call of the user's: only get_weather's stream.
    assert {e.tool_call_delta.call_id for e in recorder.events if e.WhichOneof("kind") == "tool_call_delta"} == {
        "call_w"
    }
    assert recorder.text() == "Sunny in Paris."
    assert [u[:3] for u in usages(recorder)] == [(30, 4, 34), (40, 6, 46), (50, 8, 58)]
    assert recorder.terminal().WhichOneof("kind") == "complete"


async def test_history_follows_the_agents_own_prompt(fake_provider: ScriptedModel, own_client: AsyncOpenAI) -> None:
    fake_provider.script(Turn.text("Still sunny."))
    history = (ChatMessage("user", "Weather?"), ChatMessage("assistant", "Sunny."))
    recorder = Recorder()
    request = AiRequest(message="And now?", system_prompt="Be terse.", history=history)
    await host(fake_provider, weather_agent(own_client, []), recorder, refusing(recorder), request)
    assert fake_provider.requests[0]["messages"] == [
        {"role": "system", "content": "You report the weather."},
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "And now?"},
    ]


async def test_an_agent_without_an_llm_of_its_own_runs_on_the_platforms(
    fake_provider: ScriptedModel, own_client: AsyncOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_provider.script(Turn.text("ok", usage=(3, 1)), Turn.text("ok", usage=(4, 2)))
    # LlamaIndex's global default: OpenAI's public API with OPENAI_API_KEY, never followed.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-never-sent")
    monkeypatch.setattr(Settings, "_llm", None)
    default = FunctionAgent(name="plain", tools=[weather_tool([])])
    assert default.llm is Settings._llm
    recorder = Recorder()
    await host(fake_provider, default, recorder, refusing(recorder))
    # An LLM of its own is kept, as it is configured (here: no streaming, so its answer is sent whole).
    # (A tool, since an agent with none sends `tools: null`, which the scripted provider refuses.)
    quiet = FunctionAgent(
        name="quiet", tools=[weather_tool([])], llm=own_llm(own_client, "quiet-model"), streaming=False
    )
    second_recorder = Recorder()
    await host(fake_provider, quiet, second_recorder, refusing(second_recorder))
    first, second = fake_provider.requests
    assert (first["model"], first["stream"], "temperature" in first) == ("fake-model", True, False)
    assert (second["model"], second["stream"]) == ("quiet-model", False)
    assert fake_provider.headers[0]["authorization"] == "Bearer unused"
    assert fake_provider.headers[1]["authorization"] == "Bearer own-key"
    assert (recorder.text(), second_recorder.text()) == ("ok", "ok")
    assert usages(recorder) + usages(second_recorder) == [(3, 1, 4, "fake-model"), (4, 2, 6, "quiet-model")]
    assert default.llm is Settings._llm  # the user's object is left as it was


async def test_a_react_agent_sends_its_answer_not_its_reasoning(
    fake_provider: ScriptedModel, own_client: AsyncOpenAI
) -> None:
    fake_provider.script(
        Turn.text('Thought: I need the weather.\nAction: get_weather\nAction Input: {"city": "Oslo"}'),
        Turn.text("Thought: I can answer without more tools.\nAnswer: Cold in Oslo."),
    )
    ran: list[str] = []
    agent = ReActAgent(name="reasoner", tools=[weather_tool(ran)], llm=own_llm(own_client))
    recorder = Recorder()
    await host(fake_provider, agent, recorder, through_local(recorder))
    [call] = recorder.tool_calls
    assert (call.name, json.loads(call.arguments_json)) == ("get_weather", {"city": "Oslo"})
    assert call.call_id  # ReAct's own id for a call it parsed from text
    assert ran == ["Oslo"]
    assert "Observation: sunny in Oslo" in json.dumps(fake_provider.requests[1]["messages"])
    assert recorder.text() == "Cold in Oslo."
    assert recorder.terminal().WhichOneof("kind") == "complete"


async def test_what_a_tool_raises_reaches_the_choke_point(
    fake_provider: ScriptedModel, own_client: AsyncOpenAI
) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("transfer", {"amount": 500}, call_id="call_t")),
        Turn.text("Please confirm."),
    )

    def transfer(amount: int) -> str:
        """Move money."""
        msg = f"{amount} EUR is over the daily limit"
        raise ValueError(msg)

    agent = FunctionAgent(name="bank", tools=[transfer], llm=own_llm(own_client))
    raised: list[BaseException] = []

    async def run_tool(call: ToolCallRequest) -> str:
        assert call.local is not None
        try:
            return await call.local(call.arguments_json)
        except ValueError as exc:  # the choke point reports a failed tool (here: its own words)
            raised.append(exc)
            return f"Error: {exc}"

    recorder = Recorder()
    await host(fake_provider, agent, recorder, run_tool)
    assert [str(e) for e in raised] == ["500 EUR is over the daily limit"]
    assert fake_provider.requests[1]["messages"][-1]["content"] == "Error: 500 EUR is over the daily limit"
    assert recorder.terminal().WhichOneof("kind") == "complete"


async def test_cancelling_a_hosted_run_closes_the_upstream_request(
    fake_provider: ScriptedModel, own_client: AsyncOpenAI
) -> None:
    fake_provider.script(Turn.stalled("Thinking", seconds=30))
    recorder = Recorder()
    runtime = runtime_for(fake_provider)
    ctx = context(recorder, AiRequest(message="hi"), native=weather_agent(own_client, []))
    task = asyncio.create_task(runtime.execute(ctx, recorder.session))
    try:
        for _ in range(200):
            if recorder.text():
                break
            await asyncio.sleep(0.01)
        assert recorder.text() == "Thinking"
        cancelled_at = time.monotonic()
        task.cancel()
        await asyncio.wait({task}, timeout=10.0)
        await asyncio.wait_for(fake_provider.disconnected.wait(), 10.0)
        assert time.monotonic() - cancelled_at < 10.0  # the stall lasts 30 s; loose for a loaded machine
        assert task.cancelled()
    finally:
        await runtime.aclose()


async def test_an_object_it_cannot_run_ends_the_run(fake_provider: ScriptedModel) -> None:
    recorder = Recorder()
    await host(fake_provider, object(), recorder, refusing(recorder))  # type: ignore[arg-type]
    assert recorder.terminal().error.message == "the llamaindex runtime cannot host a object"
    assert fake_provider.requests == []
