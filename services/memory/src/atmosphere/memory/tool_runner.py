"""The harness tools memory runs: `write_todos` and the eight file tools, on a conversation's workspace.

Blocking disk work runs in a thread; a failure is an `Error: ...` (or `write_todos failed: ...`)
result for the model, never an exception. The writing tools run when a replica applies them
(`replication.py`), the reading ones when a responder answers them (`responders/tools.py`).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from atmosphere.bus.sizes import DEFAULT_MAX_PAYLOAD, REPLY_ROOM, data_budget
from atmosphere.contracts.run.v1.run_pb2 import PlanStep, PlanUpdate, RunEvent
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolReply
from atmosphere.memory.plans import AgentPlan, run_write_todos
from atmosphere.memory.vfs import WorkspaceError, run_file_tool
from atmosphere.memory.workspaces import Workspaces
from atmosphere.sdk import ToolKind
from atmosphere.sdk.builtin_tools import FILE_TOOL_NAMES, FILE_TOOLS, WRITE_TODOS

WRITING_TOOLS = frozenset({WRITE_TODOS.name} | {t.name for t in FILE_TOOLS if t.kind is not ToolKind.READ})
"""The harness tools that change a workspace: they go through the write log; the rest only read."""


def plan_update(plan: AgentPlan, *, conversation_id: str, agent_id: str) -> PlanUpdate:
    """A plan as the `plan-update` event carries it."""
    update = PlanUpdate(
        steps=[PlanStep(content=s.content, status=s.status.value, active_form=s.active_form) for s in plan.steps],
        conversation_id=conversation_id,
        agent_id=agent_id,
    )
    if plan.goal is not None:
        update.goal = plan.goal
    return update


class ToolRunner:
    """Runs one tool call on the workspace its scope names; the answer is never an exception."""

    def __init__(self, workspaces: Workspaces, *, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        """Run calls on `workspaces`; a file read's page fits in one bus message of `max_payload` bytes."""
        self.workspaces = workspaces
        self._tool_bytes = data_budget(max_payload)

    async def run(self, call: ToolCall) -> ToolReply:
        """The reply to `call` (its text may still be too long for one message: the responder cuts it)."""
        try:
            arguments = json.loads(call.arguments_json or "{}")
        except (ValueError, RecursionError):  # not JSON, nested too deep, or a number too long
            arguments = None
        if not isinstance(arguments, dict):
            return ToolReply(call_id=call.call_id, content="Error: the arguments are not a JSON object", is_error=True)
        if not call.HasField("workspace"):
            if call.name == WRITE_TODOS.name:
                return ToolReply(
                    call_id=call.call_id, content="write_todos unavailable: no plan store is bound to this session."
                )
            return ToolReply(
                call_id=call.call_id, content="File tools unavailable: no agent filesystem is bound to this session."
            )
        if call.name == WRITE_TODOS.name:
            return await self._write_todos(call, arguments)
        if call.name in FILE_TOOL_NAMES:
            return await asyncio.to_thread(self._file_tool, call, arguments)
        return ToolReply(call_id=call.call_id, content=f"Error: memory serves no tool named {call.name}", is_error=True)

    async def _write_todos(self, call: ToolCall, arguments: dict[str, Any]) -> ToolReply:
        scope = call.workspace
        try:
            store = self.workspaces.plans(scope)
        except WorkspaceError as exc:
            return ToolReply(call_id=call.call_id, content=f"write_todos failed: {exc}", is_error=True)
        agent_id = scope.agent_id or call.agent or "default"
        conversation = scope.conversation_id or "default"
        text, plan = await asyncio.to_thread(run_write_todos, store, agent_id, conversation, arguments)
        # A refused plan is a failed call (a `tool-error` frame), as a refused file operation is.
        result = ToolReply(call_id=call.call_id, content=text, is_error=plan is None)
        if plan is not None:
            result.events.append(
                RunEvent(plan_update=plan_update(plan, conversation_id=conversation, agent_id=agent_id))
            )
        return result

    def _file_tool(self, call: ToolCall, arguments: dict[str, Any]) -> ToolReply:
        try:
            files = self.workspaces.files(call.workspace)
        except WorkspaceError as exc:
            return ToolReply(call_id=call.call_id, content=f"Error: {exc}", is_error=True)
        # The page of a read leaves room for the rest of the reply, so its own marker survives.
        text = run_file_tool(files, call.name, arguments, max_bytes=self._tool_bytes - REPLY_ROOM)
        return ToolReply(call_id=call.call_id, content=text, is_error=text.startswith("Error: "))
