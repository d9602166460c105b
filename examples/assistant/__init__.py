"""The default app of `make run`: an `assistant` with two small tools, and the `echo` agent.

ATMOSPHERE_APP=examples.assistant:app
"""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from atmosphere.sdk import App, ToolError, ToolKind, agent, tool
from examples.echo import Echo

_CITIES = {
    "london": "Europe/London",
    "paris": "Europe/Paris",
    "berlin": "Europe/Berlin",
    "new york": "America/New_York",
    "san francisco": "America/Los_Angeles",
    "tokyo": "Asia/Tokyo",
    "sydney": "Australia/Sydney",
    "mumbai": "Asia/Kolkata",
}


@tool(kind=ToolKind.READ)
def local_time(city: str) -> str:
    """The current local time in a city.

    Args:
        city: A major city ("Tokyo", "Paris") or an IANA time zone ("Europe/Oslo").
    """
    zone_name = _CITIES.get(city.strip().lower(), city.strip())
    try:
        zone = ZoneInfo(zone_name)
    except (ZoneInfoNotFoundError, ValueError):
        # The model reads exactly this (`Error: unknown city ...`) and can ask the user again.
        raise ToolError(f"unknown city or time zone: {city}") from None
    return datetime.now(zone).strftime(f"%H:%M on %A %d %B %Y ({zone_name})")


@tool(kind=ToolKind.READ)
def celsius_to_fahrenheit(celsius: float) -> float:
    """Convert a temperature from degrees Celsius to degrees Fahrenheit.

    Args:
        celsius: The temperature in degrees Celsius.
    """
    return round(celsius * 9 / 5 + 32, 2)


@agent(
    name="assistant",
    description="A helpful assistant that can tell the time and convert temperatures.",
    system_prompt=(
        "You are a helpful, concise assistant. Use the tools when a question needs the local time "
        "or a temperature conversion, then answer in one or two sentences."
    ),
    tools=[local_time, celsius_to_fahrenheit],
)
class Assistant:
    """Answers with the model; no @prompt needed: each prompt goes to `session.stream`."""


app = App(agents=[Assistant, Echo])
