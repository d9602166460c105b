"""The app of the chaos test: one agent whose tool counts its own executions in a ledger file.

The ledger (one line per execution, `ATMOSPHERE_CHAOS_LEDGER`) is the side effect that must
never happen twice, however often the dispatch running the tool's run is killed.
"""

import asyncio
import os
from pathlib import Path

from atmosphere.sdk import App, agent, tool

LEDGER_ENV = "ATMOSPHERE_CHAOS_LEDGER"
TOOL_SECONDS = 0.6
"""How long the tool runs after its side effect: a kill in this window is a kill inside the tool."""


@tool(timeout=30)
async def record_effect(tag: str) -> str:
    """Record one side effect for `tag`.

    Args:
        tag: The run's tag.
    """
    with Path(os.environ[LEDGER_ENV]).open("a", encoding="utf-8") as ledger:
        ledger.write(tag + "\n")
    await asyncio.sleep(TOOL_SECONDS)
    return f"recorded {tag}"


@agent(name="worker", system_prompt="Record the effect, then answer.", tools=[record_effect], harness=[])
class Worker:
    """Calls `record_effect` once, then streams a slow answer."""


app = App(agents=[Worker])
