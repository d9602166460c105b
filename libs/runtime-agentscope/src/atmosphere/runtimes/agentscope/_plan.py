"""AgentScope's task list mirrored into the platform's plan store, through `write_todos` at the choke point.

AgentScope 2's plan is the agent's task list (`AgentState.tasks_context`, kept by its `TaskCreate`
/ `TaskUpdate` tools; it replaced 1.x's `PlanNotebook`), which has no change hooks: the run's
event stream says when a tool finished, and the list is compared with what the store last got.
Each change is sent as one `write_todos` call (the full list) through `ctx.run_tool`, so the
plan is persisted per agent and conversation and a `plan-update` event reaches the client, as
for the built-in `write_todos`.

States map one to one (`pending`, `in_progress`, `completed`); a task the agent deletes
(`TaskUpdate(status="deleted")`, "no longer relevant") stays in the mirrored plan as
`abandoned`, where it was, instead of vanishing from the client's view.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from agentscope.state import Task

from atmosphere.sdk.builtin_tools import WRITE_TODOS
from atmosphere.sdk.runtime import ToolCallRequest, ToolRunner

log = logging.getLogger("atmosphere.runtimes.agentscope")

TASK_TOOL_NAMES = frozenset({"TaskCreate", "TaskGet", "TaskList", "TaskUpdate"})
"""AgentScope's plan tools (`agentscope.tool.TaskCreate`, ...)."""
ABANDONED = "abandoned"

Step = tuple[str, str]
"""One step as `write_todos` takes it: (content, status)."""


class PlanBridge:
    """Sends the agent's task list to the plan store whenever it changed."""

    def __init__(self, run_tool: ToolRunner) -> None:
        """Send through `run_tool` (the run's choke point)."""
        self._run_tool = run_tool
        self._steps: dict[str, Step] = {}
        """Every task the run has seen, by id, in the order they appeared."""
        self._sent: list[Step] = []

    async def sync(self, tasks: Sequence[Task], call_id: str) -> None:
        """Send the plan if `tasks` changed it; `call_id` is the tool call that changed it."""
        current = {task.id: (task.subject, task.state) for task in tasks}
        for task_id, (content, _) in self._steps.items():
            if task_id not in current:
                self._steps[task_id] = (content, ABANDONED)
        self._steps.update(current)
        steps = list(self._steps.values())
        if steps == self._sent:
            return
        self._sent = steps
        arguments = {"todos": [{"content": content, "status": status} for content, status in steps]}
        call = ToolCallRequest(f"{call_id}-plan", WRITE_TODOS.name, json.dumps(arguments))
        result = await self._run_tool(call)
        if result.startswith(("Error", "write_todos failed", "write_todos unavailable")):
            log.warning("the agent's plan was not stored: %s", result)
