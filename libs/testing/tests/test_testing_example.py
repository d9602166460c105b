"""The README's "Test your agent" example, run against the example app of `make run`."""

from __future__ import annotations

from atmosphere.testing import ScriptedModel, Turn, run_agent
from examples.assistant import app


def test_the_assistant_converts_a_temperature_with_its_tool() -> None:
    model = ScriptedModel(
        Turn.tool_call("celsius_to_fahrenheit", celsius=21),
        Turn.text("21 °C is 69.8 °F."),
    )
    result = run_agent(app, "assistant", "What is 21 °C in Fahrenheit?", model=model)

    assert result.completed
    assert result.text == "21 °C is 69.8 °F."
    assert result.tool_results() == {"celsius_to_fahrenheit": "69.8"}
    assert model.requests[1].last_tool_result == "69.8"


def test_an_unknown_city_is_a_tool_error_the_model_can_recover_from() -> None:
    model = ScriptedModel(Turn.tool_call("local_time", city="Atlantis"), Turn.text("Which city did you mean?"))
    result = run_agent(app, "assistant", "Time in Atlantis?", model=model)

    assert result.completed
    assert [f["data"]["error"] for f in result.of("tool-error")] == ["Error: unknown city or time zone: Atlantis"]
