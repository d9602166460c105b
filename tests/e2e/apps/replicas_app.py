"""The app of the sandbox-replica test: two slow tools, one safe to repeat and one not.

Each call appends `<tag> <pid> <parent pid>` to a ledger (`ATMOSPHERE_REPLICAS_LEDGER`) when it
starts, so the test knows which sandbox replica (or that replica's tool worker) took it.
"""

import asyncio
import os
from pathlib import Path

from atmosphere.sdk import App, agent, tool

LEDGER_ENV = "ATMOSPHERE_REPLICAS_LEDGER"
TOOL_SECONDS = 1.5
"""Long enough for a replica to be killed while it holds calls."""


def _started(tag: str) -> None:
    with Path(os.environ[LEDGER_ENV]).open("a", encoding="utf-8") as ledger:
        ledger.write(f"{tag} {os.getpid()} {os.getppid()}\n")


@tool(timeout=5)
async def slow_note(tag: str) -> str:
    """Write a note for `tag` (not safe to repeat).

    Args:
        tag: The run's tag.
    """
    _started(tag)
    await asyncio.sleep(TOOL_SECONDS)
    return f"noted {tag}"


@tool(timeout=5, idempotent=True)
async def slow_lookup(tag: str) -> str:
    """Look `tag` up (safe to repeat).

    Args:
        tag: The run's tag.
    """
    _started(tag)
    await asyncio.sleep(TOOL_SECONDS)
    return f"looked up {tag}"


@agent(name="replicas", system_prompt="Use the tool, then answer.", tools=[slow_note, slow_lookup], harness=[])
class Replicas:
    """Calls one slow tool, then answers with what it said."""


app = App(agents=[Replicas])
