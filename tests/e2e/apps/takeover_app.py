"""The app of the default-mode takeover test: a tool that records its effect, then holds until released.

The ledger (one line per execution, `ATMOSPHERE_TAKEOVER_LEDGER`) is the side effect that must
never happen twice. After writing it the tool waits for `<ledger>.<tag>.release` to exist (at
most `HOLD_SECONDS`), so the test kills or freezes the dispatch running it while the call is
surely under way.
"""

import asyncio
import os
import time
from pathlib import Path

from atmosphere.sdk import App, agent, tool

LEDGER_ENV = "ATMOSPHERE_TAKEOVER_LEDGER"
HOLD_SECONDS = 60.0


def release_file(ledger: Path, tag: str) -> Path:
    """The file whose existence ends the call for `tag`."""
    return ledger.with_name(f"{ledger.name}.{tag}.release")


@tool(timeout=90)
async def record_effect(tag: str) -> str:
    """Record one side effect for `tag`, then wait to be released.

    Args:
        tag: The run's tag.
    """
    ledger = Path(os.environ[LEDGER_ENV])
    with ledger.open("a", encoding="utf-8") as lines:
        lines.write(tag + "\n")
    release = release_file(ledger, tag)
    deadline = time.monotonic() + HOLD_SECONDS
    while not release.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return f"recorded {tag}"


@agent(name="worker", system_prompt="Record the effect, then answer.", tools=[record_effect], harness=[])
class Worker:
    """Calls `record_effect` once, then answers."""


app = App(agents=[Worker])
