"""An Atmosphere agent on SK: its tools, prompt and settings go out as declared, every call to the choke point."""

from __future__ import annotations

import json
from typing import Any

from atmosphere.runtimes.semantic_kernel import SemanticKernelAgentRuntime
from atmosphere.sdk import AiRequest
from atmosphere.sdk.runtime import GenerationOptions, RuntimeConfig, ToolSpec
from atmosphere.testing.model_turns import ToolCallScript, Turn
from atmosphere.testing.runtime_contract import City, Recorder, context
from atmosphere.testing.scripted_model import ScriptedModel

FORECAST = ToolSpec(
    name="get-forecast",
    description="The forecast of a place.",
    parameters={
        "type": "object",
        "properties": {"place": {"$ref": "#/$defs/Place"}, "days": {"type": "integer"}},
        "required": ["place"],
        "additionalProperties": False,
        "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}}}},
    },
)


async def run(provider: ScriptedModel, request: AiRequest, recorder: Recorder, **overrides: Any) -> Recorder:
    config = overrides.pop("config", None) or RuntimeConfig(base_url=provider.base_url, model="fake-model")
    runtime = SemanticKernelAgentRuntime(config)
    try:
        await runtime.execute(context(recorder, request, **overrides), recorder.session)
    finally:
        await runtime.aclose()
    return recorder


async def test_a_tool_is_offered_as_declared_and_every_call_reaches_the_choke_point(
    fake_provider: ScriptedModel,
) -> None:
    # A dashed name, a `$ref` into `$defs`, no extra properties: SK's own functions could carry none of it.
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("get-forecast", {"days": "many"}, call_id="call_f")),
        Turn.text("Cannot tell."),
    )
    recorder = await run(fake_provider, AiRequest(message="Forecast?"), Recorder(), tools=(FORECAST,))
    first, second = fake_provider.requests
    assert first["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get-forecast",
                "description": FORECAST.description,
                "parameters": FORECAST.parameters,
            },
        }
    ]
    # Arguments that miss the schema still reach the choke point (which validates them), as sent.
    [call] = recorder.tool_calls
    assert (call.call_id, call.name, json.loads(call.arguments_json)) == ("call_f", "get-forecast", {"days": "many"})
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_f", "content": "result of get-forecast"}
    # No message carries SK's agent name: the request is the built-in runtime's.
    assert not [m for m in second["messages"] if "name" in m]


async def test_the_system_prompt_is_sent_verbatim(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("ok"))
    prompt = "Quote {{$input}} and {{time.now}} literally."  # SK's template syntax, not rendered
    await run(fake_provider, AiRequest(message="hi", system_prompt=prompt), Recorder())
    assert fake_provider.requests[0]["messages"][0] == {"role": "system", "content": prompt}


async def test_generation_options_go_out(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("ok"))
    generation = GenerationOptions(temperature=0.2, max_tokens=50, top_p=0.9, stop=("END",))
    config = RuntimeConfig(base_url=fake_provider.base_url, model="fake-model", generation=generation)
    await run(fake_provider, AiRequest(message="hi"), Recorder(), config=config)
    sent = fake_provider.requests[0]
    assert (sent["temperature"], sent["max_tokens"], sent["top_p"], sent["stop"]) == (0.2, 50, 0.9, ["END"])
    assert "tools" not in sent  # an agent without tools is offered none


async def test_a_run_without_a_tool_runner_tells_the_model(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("get-forecast", {"place": {"city": "Oslo"}}, call_id="call_f")),
        Turn.text("No tools here."),
    )
    recorder = await run(fake_provider, AiRequest(message="?"), Recorder(), tools=(FORECAST,), run_tool=None)
    assert fake_provider.requests[1]["messages"][-1]["content"] == "Error: no tool runner is attached to this run"
    assert recorder.terminal().WhichOneof("kind") == "complete"


async def test_structured_output_is_refused_with_the_reason(fake_provider: ScriptedModel) -> None:
    recorder = await run(fake_provider, AiRequest(message="Weather?", response_format=City), Recorder())
    error = recorder.terminal().error
    assert error.message.startswith("the semantic-kernel runtime has no structured output")
    assert error.code == "runtime.failed"
    assert fake_provider.requests == []


async def test_a_provider_that_stalls_mid_answer_times_out(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.stalled("Thinking", seconds=30))
    config = RuntimeConfig(base_url=fake_provider.base_url, model="fake-model", stall_timeout=0.3)
    recorder = await run(fake_provider, AiRequest(message="hi"), Recorder(), config=config)
    assert recorder.text() == "Thinking"
    error = recorder.terminal().error
    assert (error.message, error.retryable) == ("the model provider did not answer in time", True)
