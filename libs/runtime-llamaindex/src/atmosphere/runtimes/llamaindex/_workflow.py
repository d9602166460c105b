"""The workflow every run executes: LlamaIndex's `AgentWorkflow`, with each tool call through the choke point.

An agent's tool is called with the model's arguments only, so the call's id (which the platform's
events, approvals and journal name it by) is not known where the tool runs: the `call_tool` step
(which receives the `ToolCall` event, id included) puts it in a context variable for the call it
makes. `_call_tool`, where LlamaIndex calls a tool, then hands the call to the choke point instead;
a hosted agent's own tool runs as the call's `local`, once every gate passed. The handoff tool of
a multi-agent workflow is LlamaIndex's control flow, not a tool of the user's, and runs as it is.

The same workflow runs a single agent (an Atmosphere agent built as a `FunctionAgent`, or a hosted
agent) and a hosted `AgentWorkflow`'s agents: LlamaIndex's agents are steps of it either way (their
own `take_step`, `handle_tool_call_results` and `finalize`), so one place gates every call.
"""

from __future__ import annotations

import json
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from llama_index.core.agent.workflow import AgentInput, AgentOutput, AgentWorkflow, ToolCall, ToolCallResult
from llama_index.core.agent.workflow.multi_agent_workflow import handoff
from llama_index.core.tools import AsyncBaseTool, FunctionTool, ToolOutput
from llama_index.core.workflow import Context, StopEvent, step

from atmosphere.runtimes.llamaindex._stream import Forwarder
from atmosphere.runtimes.llamaindex._tools import NO_TOOL_RUNNER, TOOL_LIMIT_REACHED, SpecTool, ToolLoop
from atmosphere.sdk.runtime import ToolCallRequest, ToolRunner

_CALL_ID: ContextVar[str] = ContextVar("atmosphere_llamaindex_call_id", default="")
"""The id of the tool call the current `call_tool` step makes."""


@dataclass
class Gate:
    """What one run's workflow needs to hand its tool calls to the choke point."""

    run_tool: ToolRunner | None
    forwarder: Forwarder
    loop: ToolLoop | None = None
    """The Atmosphere agent's tool loop; a hosted object keeps LlamaIndex's own iteration limit."""
    answers: int = field(default=0)
    """Model answers the workflow has parsed so far."""

    def answered(self, output: AgentOutput) -> None:
        """Count a model answer, and its tool round against the loop.

        Raises:
            ToolLoopExhaustedError: the answer asks for tools past a strict cap.
        """
        self.answers += 1
        if self.loop is not None and output.tool_calls:
            self.loop.count()

    @property
    def withdrawn(self) -> bool:
        """Whether a lenient cap withdrew the tools (its round's calls are refused, none are offered)."""
        return self.loop is not None and self.loop.withdrawn

    async def run(self, ctx: Context, tool: AsyncBaseTool, arguments: dict[str, Any]) -> str:
        """The text the model reads for a call of `tool`, once the choke point ran (or refused) it.

        The answer that asked for it is forwarded first (its text, argument deltas and usage), so
        the client sees a round's answer before the round's tool calls, as on the built-in runtime.
        """
        await self.forwarder.caught_up(self.answers)
        if self.run_tool is None:
            return NO_TOOL_RUNNER
        name = tool.metadata.get_name()
        # An Atmosphere agent's tool runs in the sandbox; a hosted agent's own runs here, after the gates.
        local = None if isinstance(tool, SpecTool) else _local(ctx, tool)
        call = ToolCallRequest(call_id=_CALL_ID.get(), name=name, arguments_json=json.dumps(arguments), local=local)
        return await self.run_tool(call)


def _local(ctx: Context, tool: AsyncBaseTool) -> Any:
    """The hosted tool itself, run with the arguments the gates let through (an approver may have edited them).

    As LlamaIndex calls it (a `FunctionTool` that asks for the workflow's `Context` gets it), except
    that a failure propagates: the choke point reports it as the tool's error.
    """

    async def local(arguments_json: str) -> str:
        arguments = json.loads(arguments_json or "{}")
        if isinstance(tool, FunctionTool) and tool.requires_context and tool.ctx_param_name is not None:
            arguments[tool.ctx_param_name] = ctx
        output = await tool.acall(**arguments)
        text = output.content
        return f"Error: {text}" if output.is_error and not text.startswith("Error") else text

    return local


def _is_handoff(tool: AsyncBaseTool) -> bool:
    return isinstance(tool, FunctionTool) and tool.real_fn is handoff


class GatedAgentWorkflow(AgentWorkflow):
    """`AgentWorkflow` whose every tool call (the handoff aside) passes the run's `Gate`."""

    def __init__(self, gate: Gate, **config: Any) -> None:
        """An `AgentWorkflow` of `config` (its constructor's arguments), gated by `gate`."""
        super().__init__(**config)
        self._gate = gate

    @step
    async def parse_agent_output(self, ctx: Context, ev: AgentOutput) -> StopEvent | AgentInput | ToolCall | None:
        """Count the answer (and its tool round) before LlamaIndex dispatches its tool calls."""
        self._gate.answered(ev)
        parsed: StopEvent | AgentInput | ToolCall | None = await super().parse_agent_output(ctx, ev)
        return parsed

    @step
    async def call_tool(self, ctx: Context, ev: ToolCall) -> ToolCallResult:
        """Run one call with its id known; a call past a lenient cap is refused without running."""
        if self._gate.withdrawn:
            output = ToolOutput(
                content=TOOL_LIMIT_REACHED, tool_name=ev.tool_name, raw_input=ev.tool_kwargs, is_error=True
            )
            return ToolCallResult(
                tool_name=ev.tool_name,
                tool_kwargs=ev.tool_kwargs,
                tool_id=ev.tool_id,
                tool_output=output,
                return_direct=False,
            )
        token = _CALL_ID.set(ev.tool_id)
        try:
            result: ToolCallResult = await super().call_tool(ctx, ev)
        finally:
            _CALL_ID.reset(token)
        return result

    async def get_tools(self, agent_name: str, input_str: str | None = None) -> list[AsyncBaseTool]:
        """The agent's tools, or none once a lenient cap withdrew them."""
        if self._gate.withdrawn:
            return []
        return list(await super().get_tools(agent_name, input_str))

    async def _call_tool(self, ctx: Context, tool: AsyncBaseTool, tool_input: dict[str, Any]) -> ToolOutput:
        """The call as the choke point answers it (the handoff tool runs as LlamaIndex runs it)."""
        if _is_handoff(tool):
            return await super()._call_tool(ctx, tool, tool_input)
        text = await self._gate.run(ctx, tool, tool_input)
        return ToolOutput(
            content=text,
            tool_name=tool.metadata.get_name(),
            raw_input=tool_input,
            raw_output=text,
            is_error=text.startswith("Error:"),
        )
