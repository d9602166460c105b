import asyncio
from typing import Literal

import pytest
from pydantic import BaseModel

from atmosphere.contracts.tool.v1.tool_pb2 import ToolKind as ProtoToolKind
from atmosphere.sdk import Tool, ToolKind, UserError, tool
from atmosphere.sdk.host import ToolArgumentsError, render_result


@tool
def get_weather(city: str, units: Literal["metric", "imperial"] = "metric") -> str:
    """Current weather for a city.

    Args:
        city: The city name.
        units: The unit system.
    """
    return f"{city}: 21 {units}"


class Point(BaseModel):
    x: float
    y: float


@tool(name="distance", description="Distance between two points.", kind=ToolKind.READ, timeout=5, idempotent=True)
async def measure(a: Point, b: Point) -> float:
    return ((a.x - b.x) ** 2 + (a.y - b.y) ** 2) ** 0.5


def test_schema_comes_from_the_signature_and_docstring() -> None:
    assert isinstance(get_weather, Tool)
    assert get_weather.name == "get_weather"
    assert get_weather.description == "Current weather for a city."
    assert get_weather.parameters == {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "city": {"type": "string", "description": "The city name."},
            "units": {
                "enum": ["metric", "imperial"],
                "type": "string",
                "default": "metric",
                "description": "The unit system.",
            },
        },
        "required": ["city"],
    }
    assert get_weather("Oslo") == "Oslo: 21 metric"  # still a plain function


def test_options_and_nested_models() -> None:
    assert (measure.name, measure.kind, measure.timeout) == ("distance", ToolKind.READ, 5)
    assert "$defs" in measure.parameters
    descriptor = measure.descriptor()
    assert descriptor.kind == ProtoToolKind.TOOL_KIND_READ
    assert descriptor.timeout_seconds == 5
    # Declared safe to repeat, and published so (a durable run re-runs it if its worker died in it).
    assert (measure.idempotent, descriptor.idempotent) == (True, True)
    assert (get_weather.idempotent, get_weather.descriptor().idempotent) == (False, False)


async def test_invoke_validates_then_renders() -> None:
    assert await get_weather.invoke({"city": "Rome"}) == "Rome: 21 metric"
    assert await measure.invoke({"a": {"x": 0, "y": 0}, "b": {"x": 3, "y": 4}}) == "5.0"
    with pytest.raises(ToolArgumentsError) as bad:
        await get_weather.invoke({"city": "Rome", "units": "kelvin"})
    assert bad.value.details[0].startswith("units:")
    with pytest.raises(ToolArgumentsError):
        await get_weather.invoke({"town": "Rome"})


def test_results_render_for_the_model() -> None:
    assert render_result("text") == "text"
    assert render_result(None) == "null"
    assert render_result({"a": [1, 2]}) == '{"a":[1,2]}'
    assert render_result(Point(x=1, y=2)) == '{"x":1.0,"y":2.0}'


def test_misuse_fails_at_import_time() -> None:
    with pytest.raises(UserError, match="type annotation"):

        @tool
        def untyped(city) -> str:  # type: ignore[no-untyped-def]
            """Doc."""
            return city  # type: ignore[no-any-return]

    with pytest.raises(UserError, match="args"):

        @tool
        def variadic(*cities: str) -> str:
            """Doc."""
            return ""

    with pytest.raises(UserError, match="description"):

        @tool
        def undocumented(city: str) -> str:
            return city

    with pytest.raises(UserError, match="JSON schema"):

        @tool
        def opaque(lock: asyncio.Lock) -> str:
            """Doc."""
            return ""

    with pytest.raises(UserError, match="timeout"):

        @tool(timeout=0)
        def instant(city: str) -> str:
            """Doc."""
            return city
