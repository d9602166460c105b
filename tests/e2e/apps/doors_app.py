"""The app of the protocol doors' suite (MCP, AG-UI, A2A): one agent per thing a door must carry.

ATMOSPHERE_APP=tests.e2e.apps.doors_app:app
"""

from __future__ import annotations

import os
from pathlib import Path

from atmosphere.sdk import App, Harness, ToolKind, agent, tool
from examples.echo import Echo

CALLS_FILE_ENV = "DOORS_APP_CALLS"
"""Where each tool that ran appends a line (so a test sees whether a tool ever ran)."""


def _ran(line: str) -> None:
    with Path(os.environ[CALLS_FILE_ENV]).open("a", encoding="utf-8") as calls:
        calls.write(line + "\n")


@tool(kind=ToolKind.DELETE, requires_approval=True)
def delete_note(title: str) -> str:
    """Delete a note (asks for approval first).

    Args:
        title: The note's title.
    """
    _ran(f"delete_note {title}")
    return f"deleted note '{title}'"


@tool(kind=ToolKind.DELETE)
def drop_table(table: str) -> str:
    """Drop a table (denied by the suite's policy).

    Args:
        table: The table's name.
    """
    _ran(f"drop_table {table}")
    return f"dropped {table}"


@tool(kind=ToolKind.READ, idempotent=True)
def read_note(title: str) -> str:
    """Read a note.

    Args:
        title: The note's title.
    """
    _ran(f"read_note {title}")
    return f"note '{title}': buy milk"


@agent(
    name="notes",
    description="Manages notes.",
    system_prompt="You manage notes with your tools.",
    tools=[delete_note, drop_table, read_note],
    harness=[],
)
class Notes:
    """A model agent whose tools show approvals, denials and results on every door."""


@agent(name="planner", description="Plans its work.", system_prompt="You plan first.", harness=[Harness.PLANNING])
class Planner:
    """A model agent with the `write_todos` plan: its plan is the AG-UI state."""


@agent(
    name="keeper", description="Remembers the conversation.", system_prompt="You remember.", harness=[Harness.MEMORY]
)
class Keeper:
    """A model agent with conversation memory: what a continued response (or thread) builds on."""


app = App(agents=[Echo, Notes, Planner, Keeper])
