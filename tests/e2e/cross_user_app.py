"""The app of the cross-user suite: one agent per kind of user state, none with long-term memory
on a WebSocket (a closing socket would start a fact extraction that takes a scripted reply).

ATMOSPHERE_APP=tests.e2e.cross_user_app:app
"""

from __future__ import annotations

from atmosphere.sdk import App, Harness, StreamingSession, ToolKind, agent, prompt, tool
from examples.echo import Echo


@agent(name="shout", description="Shouts your message back.", harness=[])
class Shout:
    """A second model-free agent: a run of another agent than echo."""

    @prompt
    async def on_prompt(self, message: str, session: StreamingSession) -> None:
        await session.send(message.upper())
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
    """Deleting a note needs its user's approval."""


@agent(name="filer", system_prompt="You keep files.", harness=[Harness.FILESYSTEM])
class Filer:
    """A per-conversation file workspace."""


@agent(name="keeper", system_prompt="You remember the conversation.", harness=[Harness.MEMORY])
class Keeper:
    """Conversation history (driven over SSE and gRPC only, see the module docstring)."""


app = App(agents=[Echo, Shout, Notes, Filer, Keeper])
