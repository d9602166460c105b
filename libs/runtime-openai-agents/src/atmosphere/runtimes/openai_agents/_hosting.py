"""Hosting a user's own `agents.Agent`: its tools, as specs and as gated calls.

The SDK has no run-level hook that can take a tool call over, so the agent is run as a clone
(`Agent.clone`, the SDK's supported way to vary an agent) whose function tools are copies with
another `on_invoke_tool`: it hands the call to `ctx.run_tool`, with the tool's own invocation
as `local`. Every agent the clone can hand off to is gated the same way, since a handoff's
target calls its tools itself. What cannot be gated is refused before the run starts rather
than let through: an MCP server's tools (listed by the SDK during the run) and the SDK's other
tool kinds (run by a provider or on the host, never as a function call of this process).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agents import Agent, FunctionTool, Handoff, Model, RunContextWrapper, ToolOutputText
from agents.tool_context import ToolContext

from atmosphere.bus.errors import RuntimeFailedError
from atmosphere.runtimes.openai_agents._tools import Escalation, Invoke
from atmosphere.sdk.runtime import ToolCallRequest, ToolRunner, ToolSpec


class UnhostableAgentError(Exception):
    """The agent has a tool that could not pass the platform's tool gate."""

    code = RuntimeFailedError.code


def native_tool_specs(agent: Agent[Any]) -> tuple[ToolSpec, ...]:
    """The function tools of `agent` and of the agents it hands off to (the first of a name wins).

    The target of a `Handoff` object is only known once it is invoked: its tools are not listed,
    so the choke point refuses them as unknown.
    """
    specs: dict[str, ToolSpec] = {}
    for reachable in _reachable(agent):
        for tool in reachable.tools:
            if isinstance(tool, FunctionTool) and tool.name not in specs:
                specs[tool.name] = _spec(tool)
    return tuple(specs.values())


def _spec(tool: FunctionTool) -> ToolSpec:
    # A tool the SDK would pause for its own approval asks the platform's approval instead (a
    # policy function cannot be asked in advance, so it counts as always).
    return ToolSpec(
        name=tool.name,
        description=tool.description,
        parameters=tool.params_json_schema,
        requires_approval=tool.needs_approval is not False,
    )


def _reachable(agent: Agent[Any]) -> list[Agent[Any]]:
    """`agent` and every agent reachable from it through handoffs that name an `Agent`."""
    seen: dict[int, Agent[Any]] = {}
    pending = [agent]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen[id(current)] = current
        pending.extend(h for h in current.handoffs if isinstance(h, Agent))
    return list(seen.values())


class Gatekeeper:
    """Gated clones of a hosted agent and of its handoff targets, for one run."""

    def __init__(self, run_tool: ToolRunner, escalation: Escalation, model: Model) -> None:
        """Gate with `run_tool`; `model` serves each agent that carries no model object of its own."""
        self._run_tool = run_tool
        self._escalation = escalation
        self._model = model
        self._gated: dict[int, Agent[Any]] = {}

    def agent(self, agent: Agent[Any]) -> Agent[Any]:
        """The clone of `agent` the run uses (one per agent, so handoff cycles end).

        Raises:
            UnhostableAgentError: a tool of the agent could not be gated.
        """
        known = self._gated.get(id(agent))
        if known is not None:
            return known
        _check_hostable(agent)
        changes: dict[str, Any] = {"tools": [self._tool(t) for t in agent.tools if isinstance(t, FunctionTool)]}
        if not isinstance(agent.model, Model):
            # No model, or a model *name*: a name would reach that provider's public API with keys
            # from the environment, bypassing the configured base URL.
            changes["model"] = self._model
        clone = agent.clone(**changes, handoffs=[])
        self._gated[id(agent)] = clone
        clone.handoffs = [self._handoff(h) for h in agent.handoffs]
        return clone

    def _handoff(self, handoff: Agent[Any] | Handoff[Any, Any]) -> Agent[Any] | Handoff[Any, Any]:
        if isinstance(handoff, Agent):
            return self.agent(handoff)
        target = handoff.on_invoke_handoff

        async def gated_target(context: RunContextWrapper[Any], arguments: str) -> Agent[Any]:
            return self.agent(await target(context, arguments))

        return dataclasses.replace(handoff, on_invoke_handoff=gated_target)

    def _tool(self, tool: FunctionTool) -> FunctionTool:
        # The platform's approval replaces the SDK's (which would pause the run instead).
        return dataclasses.replace(tool, on_invoke_tool=self._gated_invoke(tool), needs_approval=False)

    def _gated_invoke(self, tool: FunctionTool) -> Invoke:
        original = tool.on_invoke_tool

        async def invoke(context: ToolContext[Any], arguments: str) -> str:
            async def local(arguments_json: str) -> str:
                return _text(await original(context, arguments_json))

            call = ToolCallRequest(call_id=context.tool_call_id, name=tool.name, arguments_json=arguments, local=local)
            return await self._escalation.run(self._run_tool, call)

        return invoke


def _check_hostable(agent: Agent[Any]) -> None:
    if agent.mcp_servers:
        msg = f"agent {agent.name!r} has MCP servers, whose tools could not pass the platform's tool gate"
        raise UnhostableAgentError(msg)
    for tool in agent.tools:
        if not isinstance(tool, FunctionTool):
            msg = f"agent {agent.name!r} has a {type(tool).__name__}, which could not pass the platform's tool gate"
            raise UnhostableAgentError(msg)


def _text(result: Any) -> str:
    """A tool's output as the model reads it: its text, or the SDK's `str()` of anything else."""
    return result.text if isinstance(result, ToolOutputText) else str(result)
