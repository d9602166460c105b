"""Hosting a user's own `pydantic_ai.Agent`: its tools, as specs and as gated calls.

Every tool call the hosted agent makes goes through `ctx.run_tool` with `local` set: a run-level
capability wraps the agent's assembled toolset (PydanticAI's supported extension point for
cross-cutting tool behaviour), so no toolset of the agent, whatever its kind, is called any other
way. The wrapper lets every JSON object through PydanticAI's validation, so even a call with
arguments that do not fit reaches the choke point (which validates against the schema from
`native_tools`); `local` then validates the arguments the gates let through (possibly edited by
an approver) with the tool's own validator and runs the tool.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import pydantic
from pydantic_ai import Agent, ModelRetry, RunContext, ToolDefinition, ToolFailed
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ToolReturn
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset, WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool

from atmosphere.runtimes.pydantic_ai._outcome import validation_problems
from atmosphere.runtimes.pydantic_ai._tools import ANY_ARGUMENTS
from atmosphere.sdk import ModelRetry as PlatformModelRetry
from atmosphere.sdk.host import render_result
from atmosphere.sdk.runtime import ToolCallRequest, ToolRunner, ToolSpec


def native_tool_specs(agent: Agent[Any, Any]) -> tuple[ToolSpec, ...]:
    """The function tools of `agent`'s toolsets, as the choke point validates and governs them.

    Tools only known at run time (an MCP server's, a dynamic toolset's) are not listed: their
    calls still reach the choke point, which refuses a tool it does not know.
    """
    leaves: list[AbstractToolset[Any]] = []
    for toolset in agent.toolsets:
        toolset.apply(leaves.append)
    return tuple(
        _spec(tool.tool_def) for leaf in leaves if isinstance(leaf, FunctionToolset) for tool in leaf.tools.values()
    )


def _spec(definition: ToolDefinition) -> ToolSpec:
    # A tool PydanticAI would defer for human approval asks the platform's approval instead.
    return ToolSpec(
        name=definition.name,
        description=definition.description or "",
        parameters=definition.parameters_json_schema,
        requires_approval=definition.kind == "unapproved",
    )


@dataclass(kw_only=True)
class _GatedTool(ToolsetTool[Any]):
    """A tool as the model is offered it through the gate, keeping the tool it stands for."""

    original: ToolsetTool[Any]


@dataclass
class _GatedToolset(WrapperToolset[Any]):
    """The agent's toolset, each call of which passes `run_tool` before the tool itself runs."""

    run_tool: ToolRunner

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        """The wrapped tools, validated by the choke point rather than by PydanticAI first."""
        tools = await self.wrapped.get_tools(ctx)
        return {name: self._gated(tool) for name, tool in tools.items()}

    def _gated(self, tool: ToolsetTool[Any]) -> _GatedTool:
        definition = tool.tool_def
        if definition.kind == "unapproved":
            definition = replace(definition, kind="function")  # approval is the platform's gate
        return _GatedTool(
            toolset=self,
            tool_def=definition,
            max_retries=tool.max_retries,
            args_validator=ANY_ARGUMENTS,
            original=tool,
        )

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> str:
        """Hand the call to the choke point, with the tool itself as its `local`."""
        assert isinstance(tool, _GatedTool), "a tool this toolset did not list"
        original = tool.original

        async def local(arguments_json: str) -> str:
            return await _run_original(self.wrapped, name, arguments_json, ctx, original)

        call = ToolCallRequest(
            call_id=ctx.tool_call_id or "", name=name, arguments_json=json.dumps(tool_args), local=local
        )
        return await self.run_tool(call)


async def _run_original(
    toolset: AbstractToolset[Any], name: str, arguments_json: str, ctx: RunContext[Any], tool: ToolsetTool[Any]
) -> str:
    """Validate the arguments the gates let through as PydanticAI would have, then run the tool.

    What PydanticAI tells the model in-band (a retry, a failure, arguments that do not fit)
    becomes the `Error: ...` text the model reads; any other exception is the tool failing, which
    the choke point reports.
    """
    try:
        arguments = tool.args_validator.validate_json(arguments_json or "{}", context=ctx.validation_context)
        if tool.args_validator_func is not None:
            checked = tool.args_validator_func(ctx, **arguments)
            if inspect.isawaitable(checked):
                await checked
        result = await toolset.call_tool(name, arguments, ctx, tool)
    except pydantic.ValidationError as exc:
        return f"Error: the arguments do not fit {name}: {validation_problems(exc)}"
    except ModelRetry as exc:
        return PlatformModelRetry(exc.message).model_text()
    except ToolFailed as exc:
        return f"Error: {exc.message}"
    return render_result(result.return_value if isinstance(result, ToolReturn) else result)


@dataclass
class Gate(AbstractCapability[Any]):
    """Wraps the hosted agent's toolset for one run so that each call passes `run_tool`."""

    run_tool: ToolRunner

    @classmethod
    def get_serialization_name(cls) -> str | None:
        """Not part of an agent spec: it holds the run's tool runner."""
        return None

    def get_wrapper_toolset(self, toolset: AbstractToolset[Any]) -> AbstractToolset[Any]:
        """The whole assembled toolset (every toolset of the agent, output tools aside), gated."""
        return _GatedToolset(toolset, self.run_tool)


def uses_own_model(agent: Agent[Any, Any]) -> bool:
    """Whether `agent` carries a model object of its own (kept); else it runs on the platform's model.

    A model *name* is not followed: it would reach that provider's public API with keys from the
    environment, bypassing the configured `LLM_BASE_URL`.
    """
    model: object = agent.model
    return model is not None and not isinstance(model, str)


def system_texts(texts: Sequence[str]) -> str | None:
    """History's system messages (compaction summaries) as run-level instructions, or None.

    PydanticAI leaves an agent's own `system_prompt` out of a run with history unless the history
    holds no system prompt (`ReinjectSystemPrompt`), so history's system messages travel as
    instructions instead, beside the agent's own.
    """
    return "\n\n".join(texts) or None
