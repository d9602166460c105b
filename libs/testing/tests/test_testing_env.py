"""`atmosphere.testing`'s agent kit: an agent run on the real services against a scripted model."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from atmosphere.sdk import App, RetryPolicy, StreamingSession, agent, prompt, tool
from atmosphere.sdk.errors import UserError
from atmosphere.sdk.runtime import RuntimeConfig
from atmosphere.testing import AgentTestEnv, ModelRequest, ScriptedModel, ToolCallScript, Turn, run_agent


@tool
def get_weather(city: str) -> str:
    """Current weather for a city.

    Args:
        city: The city.
    """
    return f"sunny in {city}"


@tool
def explode(reason: str) -> str:
    """A tool that always fails.

    Args:
        reason: Why.
    """
    raise RuntimeError(reason)


class Forecast(BaseModel):
    city: str
    degrees: int


@agent(name="assistant", system_prompt="You help.", tools=[get_weather, explode], retry=RetryPolicy.NONE)
class Assistant:
    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.stream(message)


@agent(name="forecaster", response_format=Forecast, harness=[], retry=RetryPolicy.NONE)
class Forecaster:
    pass


@agent(name="greeter", harness=[])
class Greeter:
    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.send(f"Hello, {message}!")
        await session.complete()


APP = App(agents=[Assistant, Forecaster, Greeter])


def test_a_text_reply_streams_and_completes() -> None:
    model = ScriptedModel(Turn.text("Hi there, friend."))
    result = run_agent(APP, "assistant", "hello", model=model)
    assert result.completed
    assert result.text == "Hi there, friend."
    assert result.kinds[-2:] == ["usage", "complete"]
    assert all(frame["sessionId"] == "session-1" for frame in result.frames)
    assert model.requests[0].messages[0] == {"role": "system", "content": "You help."}
    assert model.requests[0].messages[-1] == {"role": "user", "content": "hello"}


def test_a_tool_call_runs_the_real_tool_and_feeds_its_result_back() -> None:
    model = ScriptedModel(Turn.tool_call("get_weather", city="Paris"), Turn.text("It is sunny."))
    result = run_agent(APP, "assistant", "weather?", model=model)
    assert result.completed
    assert result.tool_results() == {"get_weather": "sunny in Paris"}
    assert result.kinds.index("tool-start") < result.kinds.index("tool-result")
    assert model.requests[1].last_tool_result == "sunny in Paris"
    # The harness's built-in tools are offered next to the agent's own.
    assert {"get_weather", "write_todos", "ls", "read_file"} <= set(model.requests[0].tools)


def test_builtin_file_and_plan_tools_run_over_a_temporary_workspace() -> None:
    model = ScriptedModel(
        Turn.tool_calls(
            ToolCallScript("write_todos", {"todos": [{"content": "Write notes", "status": "in_progress"}]}),
            ToolCallScript("write_file", {"path": "notes.md", "content": "remember"}),
        ),
        Turn.tool_call("read_file", path="notes.md"),
        Turn.text("Done."),
    )
    result = run_agent(APP, "assistant", "take notes", model=model)
    assert result.completed
    assert result.tool_results()["read_file"] == "remember"
    plan = result.of("plan-update")[0]["data"]
    assert plan["steps"] == [{"content": "Write notes", "status": "in_progress"}]


def test_structured_output_is_validated_and_returned() -> None:
    model = ScriptedModel(Turn.structured(Forecast(city="Oslo", degrees=3)))
    result = run_agent(APP, "forecaster", "Oslo?", model=model)
    assert result.completed
    assert result.output(Forecast) == Forecast(city="Oslo", degrees=3)
    assert model.requests[0].body["response_format"]["type"] == "json_schema"


def test_structured_output_that_does_not_match_ends_with_an_error() -> None:
    result = run_agent(APP, "forecaster", "Oslo?", model=ScriptedModel(Turn.text('{"city": "Oslo"}')))
    assert result.error is not None
    assert result.error["code"] == "runtime.structured_output_invalid"


def test_a_model_error_ends_the_run_with_an_error_frame() -> None:
    result = run_agent(APP, "assistant", "hi", model=ScriptedModel(Turn.error("context too long", status=400)))
    assert not result.completed
    assert result.error is not None
    assert "context too long" in result.error["data"]


def test_a_failing_tool_is_a_tool_error_the_model_sees() -> None:
    model = ScriptedModel(Turn.tool_call("explode", reason="boom"), Turn.text("Sorry."))
    result = run_agent(APP, "assistant", "go", model=model)
    assert result.completed
    assert [f["event"] for f in result.of("tool-error")] == ["tool-error"]
    assert model.requests[1].last_tool_result == result.tool_errors()["explode"]
    assert result.tool_errors()["explode"].startswith("Error")
    assert result.tool_results() == {}  # an error is never mistaken for a result


def test_bad_tool_arguments_are_refused_before_the_tool_runs() -> None:
    model = ScriptedModel(Turn.tool_call("get_weather", town="Paris"), Turn.text("Oops."))
    result = run_agent(APP, "assistant", "go", model=model)
    assert "tool-start" not in result.kinds
    assert "town" in (model.requests[1].last_tool_result or "")


def test_model_requests_are_refused_without_a_script() -> None:
    result = run_agent(APP, "assistant", "hi")
    assert result.error is not None
    assert "Model requests are refused" in result.error["data"]


def test_a_script_that_runs_out_fails_loudly() -> None:
    model = ScriptedModel(Turn.tool_call("get_weather", city="Rome"))
    result = run_agent(APP, "assistant", "hi", model=model)
    assert result.error is not None
    assert "no turn left for request 2" in result.error["data"]


def test_an_agent_that_does_not_call_the_model_needs_no_script() -> None:
    result = run_agent(APP, "greeter", "Ada")
    assert result.completed
    assert result.text == "Hello, Ada!"


def test_a_function_script_sees_each_request() -> None:
    def answer(request: ModelRequest) -> Turn:
        return Turn.text(f"you said {request.messages[-1]['content']}")

    model = ScriptedModel(function=answer)
    assert run_agent(APP, "assistant", "x", model=model).text == "you said x"


async def test_one_environment_keeps_the_conversation_across_runs() -> None:
    model = ScriptedModel(Turn.text("First answer."), Turn.text("Second answer."))
    async with AgentTestEnv(APP, model=model) as env:
        await env.run("assistant", "one")
        second = await env.run("assistant", "two")
    assert second.completed
    roles = [m["role"] for m in model.requests[1].messages]
    assert roles == ["system", "user", "assistant", "user"]


def test_misuse_is_a_clear_user_error() -> None:
    with pytest.raises(UserError, match="runtime_config"):
        AgentTestEnv(APP, allow_model_requests=True)
    with pytest.raises(UserError, match="no agent named"):
        run_agent(APP, "nobody", "hi")
    with pytest.raises(UserError, match="HTTP error status"):
        Turn.error("x", status=200)


def test_a_builtin_tool_refuses_an_argument_it_does_not_take() -> None:
    # Issue 9: `ls({"path": ...})` silently listed the root; user tools refuse the same mistake.
    model = ScriptedModel(
        Turn.tool_calls(
            ToolCallScript("ls", {"path": "notes"}),
            ToolCallScript("write_todos", {"todos": [], "todo": "typo"}),
        ),
        Turn.text("Oops."),
    )
    result = run_agent(APP, "assistant", "look", model=model)
    assert result.completed
    results = result.tool_errors()
    assert results["ls"] == "Error: ls got an unknown argument 'path' (it takes: dir)"
    assert results["write_todos"] == "write_todos failed: got an unknown argument 'todo' (it takes: todos, goal)"
    assert sorted(f["data"]["toolName"] for f in result.of("tool-error")) == ["ls", "write_todos"]
    assert result.of("plan-update") == []


def test_a_failing_script_function_shows_in_the_runs_error() -> None:
    def broken(_request: ModelRequest) -> Turn:
        raise KeyError("oops")

    result = run_agent(APP, "assistant", "hi", model=ScriptedModel(function=broken))
    assert result.error is not None
    assert "the script function raised KeyError" in result.error["data"]


async def test_run_agent_inside_an_event_loop_points_to_the_async_api() -> None:
    with pytest.raises(UserError, match="async with AgentTestEnv"):
        run_agent(APP, "greeter", "Ada")


async def test_model_requests_reach_a_real_provider_only_when_allowed(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("From the wire."))
    config = RuntimeConfig(base_url=fake_provider.base_url, model="real")
    async with AgentTestEnv(APP, runtime_config=config) as env:  # configured, but not allowed
        refused = await env.run("assistant", "hi")
    assert refused.error is not None
    assert "refused" in refused.error["data"]
    assert fake_provider.requests == []
    async with AgentTestEnv(APP, allow_model_requests=True, runtime_config=config) as env:
        allowed = await env.run("assistant", "hi")
    assert allowed.text == "From the wire."
    assert len(fake_provider.requests) == 1
