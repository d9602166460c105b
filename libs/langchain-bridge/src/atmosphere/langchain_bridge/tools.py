"""An agent's `ToolSpec`s as LangChain tools whose every call goes through dispatch's choke point."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from langchain_core.tools import BaseTool, StructuredTool
from langgraph.prebuilt import ToolRuntime  # LangGraph's own (`langchain.tools` re-exports it): no LangChain here

from atmosphere.sdk.runtime import AgentExecutionContext, ToolCallRequest, ToolRunner, ToolSpec

NO_TOOL_RUNNER = "Error: no tool runner is attached to this run"
"""What the model reads when a run that cannot run tools is asked for one (the built-in runtime's text)."""
TOOL_LIMIT_REACHED = "Error: the tool-call limit for this request was reached; answer with what you have"
"""What the model reads for the calls past a lenient tool loop's cap (the built-in runtime's text)."""


async def refuse_without_runner(call: ToolCallRequest) -> str:
    """The runner of a run without one: every call is refused, none is run."""
    del call
    return NO_TOOL_RUNNER


def run_tool_of(ctx: AgentExecutionContext) -> ToolRunner:
    """The run's choke point (`ctx.run_tool`), or for a run without one a runner refusing every call."""
    return ctx.run_tool or refuse_without_runner


def agent_tools(ctx: AgentExecutionContext) -> list[BaseTool]:
    """The Atmosphere agent's tools of one run (`ctx.tools`), every call through the run's choke point."""
    return spec_tools(ctx.tools, run_tool_of(ctx))


def spec_tools(specs: Iterable[ToolSpec], run_tool: ToolRunner) -> list[BaseTool]:
    """One LangChain tool per spec, offered to the model with the spec's own JSON schema."""
    return [_spec_tool(spec, run_tool) for spec in specs]


def _spec_tool(spec: ToolSpec, run_tool: ToolRunner) -> BaseTool:
    # `runtime: ToolRuntime` is injected by the ToolNode, never shown to the model: it carries the
    # model's id for this call, which the choke point journals and reports the call under.
    async def call(runtime: ToolRuntime, **arguments: Any) -> str:
        request = ToolCallRequest(
            call_id=runtime.tool_call_id or "",
            name=spec.name,
            arguments_json=json.dumps(arguments, ensure_ascii=False),
        )
        return await run_tool(request)

    return StructuredTool(name=spec.name, description=spec.description, args_schema=spec.parameters, coroutine=call)
