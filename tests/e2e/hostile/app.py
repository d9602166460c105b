"""The app hostile suites run: agents that make no model call they were not scripted for.

`echo` echoes; `slow` streams its words a little apart (a run that is still going while a test
does something else); `assistant` answers with the (scripted) model; `notes` asks for approval
before its tool runs. None has a harness, so no memory feature makes a model call of its own
(it would take a reply scripted for the test).
"""

from __future__ import annotations

import asyncio

from atmosphere.sdk import App, StreamingSession, ToolKind, agent, prompt, tool
from examples.echo import Echo

SLOW_WORDS = 20
SLOW_PAUSE = 0.05


@agent(name="slow", description="Streams twenty words, a little apart.", harness=[])
class Slow:
    """Streams words slowly."""

    @prompt
    async def on_prompt(self, message: str, session: StreamingSession) -> None:
        for i in range(SLOW_WORDS):
            await asyncio.sleep(SLOW_PAUSE)
            await session.send(f"{message}-{i} ")
        await session.complete()


@tool(kind=ToolKind.DELETE, requires_approval=True)
def delete_note(title: str) -> str:
    """Delete a note (asks for approval first).

    Args:
        title: The note's title.
    """
    return f"deleted note '{title}'"


@agent(name="notes", system_prompt="You manage notes.", tools=[delete_note], harness=[])
class Notes:
    """Deleting a note needs a human's approval."""


@agent(name="assistant", system_prompt="You are a helpful assistant.", harness=[])
class Assistant:
    """Answers with the model."""


app = App(agents=[Echo, Slow, Assistant, Notes])
