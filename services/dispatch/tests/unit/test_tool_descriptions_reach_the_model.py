"""Each parameter description of an agent's tools reaches the model, in the request's `tools`.

Descriptions come from `Annotated[..., Field(description=...)]` or from a docstring in any common
style (here NumPy and reST); the fake provider keeps the request body dispatch sent.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from atmosphere.sdk import App, agent, tool
from atmosphere.testing import Turn

from .conftest import Harness, kinds, request


@tool
def convert(
    amount: Annotated[float, Field(gt=0, description="The sum to convert.")],
    currency: Annotated[str, Field(pattern="^[A-Z]{3}$", description="An ISO 4217 code, e.g. EUR.")] = "EUR",
) -> str:
    """Convert a sum of dollars."""
    return f"{amount} {currency}"


@tool
def forecast(city: str, days: int = 3) -> str:
    """The weather to come.

    Parameters
    ----------
    city : str
        The city.
    days : int
        How many days ahead.
    """
    return f"sunny in {city} for {days} days"


@tool
def translate(text: str, language: str) -> str:
    """Translate a text.

    :param text: The text to translate.
    :param language: The language to translate into.
    """
    return f"{text} ({language})"


@agent(name="helper", system_prompt="Help.", tools=[convert, forecast, translate])
class Helper:
    """Answers with its tools at hand."""


APP = App(agents=[Helper])


async def test_every_parameter_description_is_in_the_models_request(harness: Harness) -> None:
    harness.provider.script(Turn.text("nothing to call"))
    await harness.executor(APP).execute(request("helper"))
    assert kinds(harness.events())[-1] == "complete"

    [body] = harness.provider.requests
    offered = {entry["function"]["name"]: entry["function"] for entry in body["tools"]}
    described = {
        name: {param: schema.get("description") for param, schema in function["parameters"]["properties"].items()}
        for name, function in offered.items()
    }
    assert described == {
        "convert": {"amount": "The sum to convert.", "currency": "An ISO 4217 code, e.g. EUR."},
        "forecast": {"city": "The city.", "days": "How many days ahead."},
        "translate": {"text": "The text to translate.", "language": "The language to translate into."},
    }
    # The constraints travel with the descriptions, and each tool keeps only its summary.
    assert offered["convert"]["parameters"]["properties"]["amount"]["exclusiveMinimum"] == 0
    assert offered["convert"]["parameters"]["properties"]["currency"]["pattern"] == "^[A-Z]{3}$"
    assert [offered[name]["description"] for name in ("convert", "forecast", "translate")] == [
        "Convert a sum of dollars.",
        "The weather to come.",
        "Translate a text.",
    ]
