"""A coding agent that plans its work and stages it in files: the planning and file harness.

ATMOSPHERE_APP=examples.coding_agent:app

Ask it to "plan a short task and save the result to a file": it writes a `write_todos` plan
(streamed as `plan-update` events, ticking as it works), saves files in its conversation's
workspace, and the admin API shows both (`/api/admin/agents/coder/plan`, `/files`).
"""

from __future__ import annotations

from atmosphere.sdk import App, ToolKind, agent, tool


@tool(kind=ToolKind.READ)
def word_count(text: str) -> int:
    """Count the words of a text.

    Args:
        text: Any text.
    """
    return len(text.split())


@agent(
    name="coder",
    description="Plans multi-step work with write_todos and stages it in workspace files.",
    system_prompt=(
        "You are a careful coding agent. For any task with more than one step, first call write_todos with "
        "the full plan (one step in_progress), keep it updated as you go, and save what you produce with "
        "write_file (use read_file, edit_file, ls, glob and grep to work with the files you saved). "
        "When you are done, mark every step completed and answer with a short summary naming the files."
    ),
    tools=[word_count],
)
class Coder:
    """The full harness applies (a plain @agent): memory, plan, files, prompt-cache hint."""


app = App(agents=[Coder])
