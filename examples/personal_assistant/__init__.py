"""A coordinator with a crew: `delegate_task` to named specialists, `task` for ad-hoc sub-agents.

ATMOSPHERE_APP=examples.personal_assistant:app

The `concierge` coordinator hands research to `researcher` and drafting to `writer` with
`delegate_task`, or spawns an ephemeral general-purpose sub-agent with `task` (its own plan and
files, removed when it finishes). Every sub-run streams into the concierge's stream, tagged with
its run id (`runId`, `parentRunId`, `agent` on each frame).
"""

from __future__ import annotations

from atmosphere.sdk import App, ToolKind, agent, coordinator, tool

_NOTES = {
    "team building": "Popular options: escape rooms, cooking classes, volunteering days, hackathons.",
    "offsite": "Offsites work best with a clear goal, free afternoons and a budget agreed in advance.",
    "python": "Python 3.11 brought faster CPython, exception groups and tomllib.",
}


@tool(kind=ToolKind.READ)
def search_notes(topic: str) -> str:
    """Search the team's notes for a topic.

    Args:
        topic: What to look for, e.g. "team building".
    """
    hits = [text for key, text in _NOTES.items() if key in topic.lower() or topic.lower() in key]
    return "\n".join(hits) or f"No notes about {topic}."


@agent(
    name="researcher",
    description="Finds facts in the team's notes.",
    system_prompt="You research questions using search_notes and answer with the facts you found, briefly.",
    tools=[search_notes],
)
class Researcher:
    """A fleet member: answers research questions."""


@agent(
    name="writer",
    description="Turns facts into a short, friendly text.",
    system_prompt="You write short, friendly texts from the facts you are given. No more than five sentences.",
)
class Writer:
    """A fleet member: drafts texts."""


@coordinator(
    name="concierge",
    fleet=[Researcher, Writer],
    description="A personal assistant that delegates to its crew.",
    system_prompt=(
        "You are a personal assistant with a crew. Use delegate_task to ask 'researcher' for facts and "
        "'writer' for drafts. For a self-contained side job (brainstorming, a draft to stage in files), "
        "spawn a sub-agent with task. Then answer the user with the result."
    ),
)
class Concierge:
    """Coordinates the crew; DELEGATION gives it delegate_task and task."""


app = App(agents=[Concierge, Researcher, Writer])
