"""The run-level plugin of a hosted agent: the tool gate, the platform's instructions, delegated events.

A plugin is the one ADK extension point every agent of a run shares — the sub-agents a root
transfers to, and the agents run as an `AgentTool` (whose runner inherits its caller's plugins) —
so one `Gate` sees every tool call and every model request of the run.
"""

from __future__ import annotations

from typing import Any

from google.adk.agents.base_agent import BaseAgent
from google.adk.agents.callback_context import CallbackContext
from google.adk.agents.invocation_context import InvocationContext
from google.adk.events.event import Event
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.tools.base_tool import BaseTool
from google.adk.tools.tool_context import ToolContext

from atmosphere.runtimes.adk._hosting import gated_call, is_control_tool
from atmosphere.runtimes.adk._stream import Forwarder
from atmosphere.sdk.runtime import ToolRunner

PLUGIN_NAME = "atmosphere_gate"


class Gate(BasePlugin):
    """Every tool call of the run through the choke point; the platform's instructions; delegated events."""

    def __init__(
        self,
        *,
        run_tool: ToolRunner,
        root: BaseAgent,
        instructions: str,
        forwarder: Forwarder,
        run_id: str,
    ) -> None:
        """Gate `root`'s run with `run_tool`; add `instructions` to every model request; forward delegated events."""
        super().__init__(name=PLUGIN_NAME)
        self._run_tool = run_tool
        self._root = root
        self._instructions = instructions
        self._forwarder = forwarder
        self._run_id = run_id
        self.session_id = ""
        """The run's own session (set once created): an event of another is an `AgentTool`'s sub-run."""

    async def before_tool_callback(
        self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: ToolContext
    ) -> dict[str, Any] | None:
        """Answer the call with the choke point's result (the tool runs only as its `local`)."""
        if is_control_tool(tool):
            return None
        return await gated_call(self._run_tool, self._root, tool, tool_args, tool_context)

    async def before_model_callback(
        self, *, callback_context: CallbackContext, llm_request: LlmRequest
    ) -> LlmResponse | None:
        """Add the platform's instructions (the request's system prompt, history's summaries) to the agent's."""
        del callback_context
        if self._instructions:
            llm_request.append_instructions([self._instructions])
        return None

    async def on_event_callback(self, *, invocation_context: InvocationContext, event: Event) -> Event | None:
        """Forward the events of an agent run as a tool into the run's stream, as the sub-agent's."""
        if invocation_context.session.id != self.session_id:
            await self._forwarder.forward_delegated(event, self._run_id)
        return None
