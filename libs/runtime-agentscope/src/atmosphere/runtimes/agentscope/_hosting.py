"""Hosting a user's own AgentScope `Agent`: its tools as specs, and a per-run copy whose every tool call is gated.

An AgentScope agent is stateful (its `state` holds the conversation, its task list, its reply),
and one hosted object serves every conversation at once: each run gets a shallow copy of the
agent with a state of its own (a deep copy of the object's, its context replaced by the
conversation's history), the agent's toolkit rebuilt around the same tools with each one gated
(`GatedToolkit`, `PermittedTool`), and its model wrapped so that tool call ids stay distinct. The
object itself is never changed.
"""

from __future__ import annotations

import copy
from typing import cast

from agentscope.agent import Agent
from agentscope.model import ChatModelBase
from agentscope.state import AgentState
from agentscope.tool import ToolBase, ToolGroup, Toolkit

from atmosphere.runtimes.agentscope._plan import TASK_TOOL_NAMES
from atmosphere.runtimes.agentscope._stream import as_context
from atmosphere.runtimes.agentscope._tools import GatedToolkit, PermittedTool
from atmosphere.runtimes.agentscope._wire import DistinctCallIds
from atmosphere.sdk import ChatMessage, ToolKind
from atmosphere.sdk.runtime import ToolRunner, ToolSpec


def _gated(tool: ToolBase) -> bool:
    """Whether a call of `tool` passes the choke point (AgentScope's plan tools are mirrored instead)."""
    return tool.name not in TASK_TOOL_NAMES


def native_tool_specs(agent: Agent) -> tuple[ToolSpec, ...]:
    """The tools of every group of `agent`'s toolkit, as the choke point validates and governs them.

    Tools only known at run time (an MCP server's) are not listed: their calls still reach the
    choke point, which refuses a tool it does not know. AgentScope's confirmation of custom tools
    is not carried over: the platform's approval (the operator's tool permissions) decides.
    """
    return tuple(
        ToolSpec(
            name=tool.name,
            description=tool.description,
            parameters=tool.input_schema,
            kind=ToolKind.READ if tool.is_read_only else ToolKind.OTHER,
        )
        for group in agent.toolkit.tool_groups
        for tool in group.tools
        if _gated(tool)
    )


def gated_toolkit(toolkit: Toolkit, run_tool: ToolRunner | None) -> GatedToolkit:
    """`toolkit` rebuilt around the same tools, groups, skills and MCP servers, each tool gated."""
    basic = next((g for g in toolkit.tool_groups if g.name == "basic"), ToolGroup("basic"))
    others = [
        ToolGroup(g.name, g.description, g.instructions, _permitted(g.tools), g.skills_or_loaders, g.mcps)
        for g in toolkit.tool_groups
        if g.name != "basic"
    ]
    return GatedToolkit(
        run_tool,
        tools=_permitted(basic.tools),
        skills_or_loaders=basic.skills_or_loaders,
        mcps=basic.mcps,
        tool_groups=others,
        meta_tool_response_template=toolkit.meta_tool_response_template,
        skill_instruction_template=toolkit.skill_instruction_template,
    )


def _permitted(tools: list[ToolBase]) -> list[ToolBase]:
    return [PermittedTool(tool) if _gated(tool) else tool for tool in tools]


def run_copy(agent: Agent, history: list[ChatMessage], run_tool: ToolRunner | None) -> Agent:
    """The copy of `agent` one run uses: its own state, gated tools, distinct call ids; cancellation re-raised.

    A cancelled AgentScope reply ends quietly with an apology message unless told to re-raise:
    dispatch cancels the task running the run, which must then end as cancelled.
    """
    run = copy.copy(agent)
    state: AgentState = agent.state.model_copy(deep=True)
    state.context = as_context(history, agent.name)
    state.summary = ""  # the platform's memory summarizes older turns into the history
    run.state = state
    run.toolkit = gated_toolkit(agent.toolkit, run_tool)
    run.model = cast(ChatModelBase, DistinctCallIds(agent.model))
    run.react_config = agent.react_config.model_copy(update={"interruption_raise_cancelled_error": True})
    return run
