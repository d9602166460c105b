"""An agent whose tool asks a human first: `approval-required` frames and `/__approval/...` replies.

ATMOSPHERE_APP=examples.approvals:app
"""

from __future__ import annotations

from atmosphere.sdk import App, ToolKind, agent, tool
from examples.assistant import Assistant
from examples.echo import Echo


@tool(kind=ToolKind.DELETE, requires_approval=True)
def delete_note(title: str) -> str:
    """Delete a note (asks for approval first).

    Args:
        title: The note's title.
    """
    return f"deleted note '{title}'"


@agent(name="notes", system_prompt="You manage notes. Ask before deleting.", tools=[delete_note])
class Notes:
    """Manages notes; deleting one needs a human's approval."""


app = App(agents=[Assistant, Echo, Notes])
