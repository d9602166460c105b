"""Hosting a user's own ADK agent: its tools as specs, the gate every call passes, its models.

Every tool call of the hosted agent — its own, its sub-agents', those of an agent it calls as an
`AgentTool` — passes `ctx.run_tool` with `local` set: a run-level plugin (`Gate`), ADK's own
extension point that sees every tool call of every agent of the run before the tool runs,
answers the call with what the choke point returned, so the tool itself runs only as `local`,
after every gate. A refused call never reaches the tool. ADK's control-flow tools
(`transfer_to_agent`, `set_model_response`) are not the agent's tools: they pass untouched.

The agent runs as a clone (`BaseAgent.clone`, which clones its sub-agents too), whose agents
with no model object of their own get the run's `PacedGemini` on the runtime's client: a model
*name* would make ADK build a client from the process's environment, bypassing the runtime's
settings, retries and deadlines. A model object the user built is kept.
"""

from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Callable, Iterator
from typing import Any, cast

from google.adk.agents.base_agent import BaseAgent
from google.adk.agents.llm_agent import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.tools.agent_tool import AgentTool
from google.adk.tools.base_tool import BaseTool
from google.adk.tools.function_tool import FunctionTool
from google.adk.tools.set_model_response_tool import SetModelResponseTool
from google.adk.tools.tool_context import ToolContext
from google.adk.tools.transfer_to_agent_tool import TransferToAgentTool
from google.genai import types

from atmosphere.bus.errors import RuntimeFailedError
from atmosphere.sdk.host import render_result
from atmosphere.sdk.runtime import ToolCallRequest, ToolRunner, ToolSpec

CONTROL_TOOLS = (TransferToAgentTool, SetModelResponseTool)
"""ADK's own control-flow tools: they move the run between agents or end it, and run no code of the user's."""
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


class UnhostableAgentError(Exception):
    """The agent has a tool whose calls could not pass the platform's tool gate."""

    code = RuntimeFailedError.code


def native_tool_specs(agent: BaseAgent) -> tuple[ToolSpec, ...]:
    """The tools of `agent`, of its sub-agents and of the agents it calls as tools (the first of a name wins).

    A toolset's tools (an MCP server's) are only known during a run: they are not listed, so the
    choke point refuses their calls as unknown.
    """
    specs: dict[str, ToolSpec] = {}
    for tool in _own_tools(agent):
        if tool.name not in specs:
            specs[tool.name] = _spec(tool)
    return tuple(specs.values())


def _own_tools(agent: BaseAgent) -> Iterator[BaseTool]:
    for reachable in _agents(agent):
        if not isinstance(reachable, LlmAgent):
            continue
        for tool in reachable.tools:
            if isinstance(tool, BaseTool) and not isinstance(tool, CONTROL_TOOLS):
                yield tool
            elif callable(tool) and not isinstance(tool, BaseTool):
                yield FunctionTool(tool)


def _agents(agent: BaseAgent) -> Iterator[BaseAgent]:
    """`agent`, its sub-agents, and the agents its agents call as tools, each once."""
    seen: set[int] = set()
    pending = [agent]
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        pending.extend(current.sub_agents)
        if isinstance(current, LlmAgent):
            pending.extend(t.agent for t in current.tools if isinstance(t, AgentTool))


def _spec(tool: BaseTool) -> ToolSpec:
    declaration = tool._get_declaration()
    # A tool ADK would pause for its own confirmation asks the platform's approval instead (a
    # policy function cannot be asked in advance, so it counts as always).
    confirmation = getattr(tool, "_require_confirmation", False)
    return ToolSpec(
        name=tool.name,
        description=(declaration.description if declaration else None) or tool.description or "",
        parameters=_parameters(declaration),
        requires_approval=confirmation is not False,
    )


def _parameters(declaration: types.FunctionDeclaration | None) -> dict[str, Any]:
    if declaration is None:
        return dict(NO_PARAMETERS)
    if isinstance(declaration.parameters_json_schema, dict):
        return declaration.parameters_json_schema
    if declaration.parameters is not None:
        schema: dict[str, Any] = declaration.parameters.json_schema.model_dump(mode="json", exclude_none=True)
        return schema
    return dict(NO_PARAMETERS)


def prepared(agent: BaseAgent, model_for: Callable[[str], BaseLlm]) -> BaseAgent:
    """The clone the run uses: agents without a model object of their own on `model_for(name)` ("" = the default).

    Raises:
        UnhostableAgentError: an agent it calls as a tool would run without the platform's gate.
    """
    clone = agent.clone()
    _assign(clone, model_for, inherits=False)
    return clone


def _assign(agent: BaseAgent, model_for: Callable[[str], BaseLlm], *, inherits: bool) -> None:
    """Give `agent` (and its sub-agents) the run's models; `inherits`: an ancestor is an `LlmAgent`."""
    if isinstance(agent, LlmAgent):
        if isinstance(agent.model, str) and (agent.model or not inherits):
            agent.model = model_for(agent.model)
        agent.tools = [_gated_agent_tool(t, model_for) if isinstance(t, AgentTool) else t for t in agent.tools]
    for sub in agent.sub_agents:
        _assign(sub, model_for, inherits=inherits or isinstance(agent, LlmAgent))


def _gated_agent_tool(tool: AgentTool, model_for: Callable[[str], BaseLlm]) -> AgentTool:
    if not tool.include_plugins:
        msg = (
            f"AgentTool {tool.name!r} runs its agent without the runner's plugins (include_plugins=False): "
            "its tools could not pass the platform's tool gate"
        )
        raise UnhostableAgentError(msg)
    gated = copy.copy(tool)
    gated.agent = prepared(tool.agent, model_for)
    return gated


def is_control_tool(tool: BaseTool) -> bool:
    """Whether `tool` is one of ADK's control-flow tools (they pass the gate untouched)."""
    return isinstance(tool, CONTROL_TOOLS)


async def gated_call(
    run_tool: ToolRunner, root: BaseAgent, tool: BaseTool, args: dict[str, Any], tool_context: ToolContext
) -> dict[str, Any]:
    """Hand one call to the choke point, with the tool itself as its `local`; the result for ADK."""

    async def local(arguments_json: str) -> str:
        return await run_own_tool(root, tool, arguments_json, tool_context)

    call = ToolCallRequest(
        call_id=tool_context.function_call_id or "", name=tool.name, arguments_json=json.dumps(args), local=local
    )
    return {"result": await run_tool(call)}


async def run_own_tool(root: BaseAgent, tool: BaseTool, arguments_json: str, tool_context: ToolContext) -> str:
    """Run the tool on the arguments the gates let through (possibly edited by an approver).

    The agent's own `before_tool_callback`s run first, as ADK would run them (one that answers
    the call stands in for the tool); its `after_tool_callback`s run after the gate, in ADK's own
    pipeline. Any exception is the tool failing, which the choke point reports.
    """
    try:
        arguments = json.loads(arguments_json or "{}")
    except ValueError:
        return f"Error: the arguments of {tool.name} are not JSON"
    if not isinstance(arguments, dict):
        return f"Error: the arguments of {tool.name} are not a JSON object"
    owner = root.find_agent(tool_context.agent_name)
    if isinstance(owner, LlmAgent):
        for callback in owner.canonical_before_tool_callbacks:
            # Called by keyword, as ADK's own pipeline calls them (its alias types them positional).
            answered = cast("Callable[..., Any]", callback)(tool=tool, args=arguments, tool_context=tool_context)
            if inspect.isawaitable(answered):
                answered = await answered
            if answered is not None:
                return render_result(answered)
    return render_result(await tool.run_async(args=arguments, tool_context=tool_context))
