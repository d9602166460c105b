"""The same agent pinned to each runtime: `forecaster-built-in`, `forecaster-langchain`, ...

ATMOSPHERE_APP=examples.runtimes.pinned:app
"""

from typing import Any

from atmosphere.sdk import App, agent, tool

RUNTIMES = (
    "built-in",
    "langchain",
    "langgraph",
    "pydantic-ai",
    "openai-agents",
    "anthropic",
    "cohere",
    "adk",
    "agentscope",
    "crewai",
    "semantic-kernel",
    "llamaindex",
)


@tool(idempotent=True)
async def get_weather(city: str) -> str:
    """Current weather for a city.

    Args:
        city: The city's name.
    """
    return f"sunny, 22C in {city}"


def forecaster(runtime: str) -> type[Any]:
    """The forecaster agent, run by `runtime`'s loop in that runtime's own dispatch pool."""

    @agent(
        name=f"forecaster-{runtime}",
        system_prompt="You answer weather questions in one sentence, using get_weather.",
        tools=[get_weather],
        runtime=runtime,
    )
    class Forecaster:
        """Answers weather questions."""

    return Forecaster


app = App(agents=[forecaster(runtime) for runtime in RUNTIMES])
