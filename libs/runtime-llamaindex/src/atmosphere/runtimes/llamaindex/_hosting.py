"""Hosting a user's own LlamaIndex agent or `AgentWorkflow`: its tools as specs, its agents in the gated workflow.

A hosted object runs as a `GatedAgentWorkflow` made of its own agents and settings (`workflow_config`):
LlamaIndex's agents are steps of an `AgentWorkflow` whether one or several, so their own turns,
tool handling and handoffs run unchanged while every tool call passes the choke point. What is
left behind: steps a subclass of the user's own overrides (the gated workflow's are
`AgentWorkflow`'s), and a workflow's `timeout` (dispatch's deadlines bound a run instead).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llama_index.core.agent.workflow import AgentWorkflow, BaseWorkflowAgent, FunctionAgent
from llama_index.core.llms import LLM
from llama_index.core.settings import Settings
from llama_index.core.tools import BaseTool, FunctionTool, ToolMetadata

from atmosphere.sdk.runtime import ToolSpec


def agents_of(native: BaseWorkflowAgent | AgentWorkflow) -> list[BaseWorkflowAgent]:
    """The agents of a hosted object: a workflow's, or the agent itself."""
    return list(native.agents.values()) if isinstance(native, AgentWorkflow) else [native]


def native_tool_specs(native: BaseWorkflowAgent | AgentWorkflow) -> tuple[ToolSpec, ...]:
    """The tools of every agent (the first of a name wins), as the choke point validates and governs them.

    The schema is the one LlamaIndex sends the model. Tools only known at run time (an agent's
    `tool_retriever`'s) are not listed: their calls still reach the choke point, which refuses a
    tool it does not know.
    """
    specs: dict[str, ToolSpec] = {}
    for agent in agents_of(native):
        for tool in agent.tools or ():
            metadata = _metadata(tool)
            name = metadata.get_name()
            if name not in specs:
                specs[name] = ToolSpec(
                    name=name, description=metadata.description, parameters=metadata.get_parameters_dict()
                )
    return tuple(specs.values())


def _metadata(tool: BaseTool | Callable[..., Any]) -> ToolMetadata:
    # LlamaIndex makes a plain function a `FunctionTool` when the agent gathers its tools.
    return tool.metadata if isinstance(tool, BaseTool) else FunctionTool.from_defaults(fn=tool).metadata


def uses_own_llm(agent: BaseWorkflowAgent) -> bool:
    """Whether `agent` was given an LLM of its own (kept); else it runs on the platform's model.

    An agent built without one holds LlamaIndex's global default (`Settings.llm`, read as
    `Settings._llm` so as not to resolve it): OpenAI's public API with `OPENAI_API_KEY` unless the
    app set another, bypassing the configured `LLM_BASE_URL`.
    """
    return agent.llm is not Settings._llm


def streams_text(agent: BaseWorkflowAgent) -> bool:
    """Whether an agent's streamed text is its answer (a function-calling agent's), not its reasoning protocol."""
    return isinstance(agent, FunctionAgent)


def workflow_config(native: BaseWorkflowAgent | AgentWorkflow, llm: LLM) -> dict[str, Any]:
    """The `AgentWorkflow` arguments that run `native` as its user built it, on `llm` where it has none of its own."""
    if isinstance(native, AgentWorkflow):
        return {
            "agents": [_with_llm(agent, llm) for agent in native.agents.values()],
            "root_agent": native.root_agent,
            "initial_state": native.initial_state,
            "handoff_prompt": native.handoff_prompt,
            "handoff_output_prompt": native.handoff_output_prompt,
            "state_prompt": native.state_prompt,
            "output_cls": native.output_cls,
            "structured_output_fn": native.structured_output_fn,
            "early_stopping_method": native.early_stopping_method,
        }
    # An `AgentWorkflow` keeps the state (its agents may have none of their own): the agent's moves there.
    agent = _with_llm(native, llm)
    if agent.initial_state:
        agent = agent.model_copy(update={"initial_state": {}})
    return {
        "agents": [agent],
        "initial_state": native.initial_state,
        "state_prompt": native.state_prompt,
        "early_stopping_method": native.early_stopping_method,
    }


def _with_llm(agent: BaseWorkflowAgent, llm: LLM) -> BaseWorkflowAgent:
    """`agent`, or a copy of it on `llm` when it has no LLM of its own (the user's object is left as it is)."""
    return agent if uses_own_llm(agent) else agent.model_copy(update={"llm": llm})
