"""A CrewAI `Crew` of one agent naming no LLM: the platform's configured model runs it.

CrewAI's `@tool` wants a docstring of its own, hence the small wrappers.
"""

from __future__ import annotations

from crewai import Agent, Crew, Task
from crewai.tools import tool

from tests.e2e.apps.adapters_app import native_forbidden_text, native_lookup_text, native_transfer_text


@tool("native_lookup")
def native_lookup(city: str) -> str:
    """Look up the weather in a city."""
    return native_lookup_text(city)


@tool("native_forbidden")
def native_forbidden(target: str) -> str:
    """Do something to a target."""
    return native_forbidden_text(target)


@tool("native_transfer")
def native_transfer(amount: int) -> str:
    """Transfer an amount of money."""
    return native_transfer_text(amount)


clerk = Agent(
    role="clerk",
    goal="Answer briefly, using your tools when asked",
    backstory="You answer briefly.",
    tools=[native_lookup, native_forbidden, native_transfer],
)
hosted = Crew(agents=[clerk], tasks=[Task(description="{message}", expected_output="A brief answer", agent=clerk)])
