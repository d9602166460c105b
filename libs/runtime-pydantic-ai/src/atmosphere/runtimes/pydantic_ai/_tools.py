"""The agent's `ToolSpec`s as a PydanticAI toolset whose every call goes to `ctx.run_tool`, within the tool loop.

PydanticAI validates a call's arguments against a toolset's validator before calling the tool;
this toolset's validator takes any JSON object, because the choke point validates the arguments
against the very schema the model was shown (and reports a misfit as the model's tool result, as
for any other runtime). PydanticAI runs the calls of one model turn concurrently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai import RunContext, ToolDefinition
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_core import SchemaValidator, core_schema

from atmosphere.bus import errors as catalogue
from atmosphere.sdk import OnMaxIterations, ToolLoopPolicy
from atmosphere.sdk.runtime import ToolCallRequest, ToolRunner, ToolSpec

ANY_ARGUMENTS = SchemaValidator(core_schema.dict_schema())
"""Lets every JSON object through: the choke point is where arguments are checked."""
NO_TOOL_RUNNER = "Error: no tool runner is attached to this run"
"""The built-in runtime's text for a tool call on a run that cannot run tools."""
TOOL_LIMIT_REACHED = "Error: the tool-call limit for this request was reached; answer with what you have"
"""The built-in runtime's text for a call refused by a lenient tool loop's cap."""


class ToolLoopExhaustedError(Exception):
    """A strict tool loop's cap was reached and the model still asked for tools."""

    code = catalogue.ToolLoopExhaustedError.code

    def __init__(self, cap: int) -> None:
        """The built-in runtime's words for a strict cap of `cap` rounds."""
        super().__init__(f"Tool loop exhausted after {cap} iterations")


@dataclass
class ToolLoop:
    """Counts the run's tool rounds (model turns that asked for tools) against its `ToolLoopPolicy`."""

    policy: ToolLoopPolicy
    withdrawn: bool = False
    """A lenient cap was reached: no more tools are offered, so the model answers with what it has."""
    _steps: list[int] = field(default_factory=list)

    def admit(self, step: int) -> bool:
        """Whether a call made in run step `step` may run (the calls of one turn share a step).

        Raises:
            ToolLoopExhaustedError: the cap is strict and this turn is one round too many.
        """
        if step not in self._steps:
            self._steps.append(step)
        if self._steps.index(step) < self.policy.cap:
            return True
        if self.policy.on_max_iterations is OnMaxIterations.FAIL:
            raise ToolLoopExhaustedError(self.policy.cap)
        self.withdrawn = True
        return False


class SpecToolset(AbstractToolset[Any]):
    """The run's tools as the model sees them; a call is the choke point's to run."""

    def __init__(self, specs: tuple[ToolSpec, ...], run_tool: ToolRunner | None, loop: ToolLoop) -> None:
        """Offer `specs`; run each call with `run_tool`, as far as `loop` admits it."""
        self._tools = {spec.name: self._tool(spec) for spec in specs}
        self._run_tool = run_tool
        self._loop = loop

    @property
    def id(self) -> str:
        """A stable id: PydanticAI keys a toolset's state by it."""
        return "atmosphere-tools"

    def _tool(self, spec: ToolSpec) -> ToolsetTool[Any]:
        # strict=False: the schema goes out as the app declared it, not rewritten for OpenAI's strict mode.
        definition = ToolDefinition(
            name=spec.name, description=spec.description, parameters_json_schema=spec.parameters, strict=False
        )
        return ToolsetTool(toolset=self, tool_def=definition, max_retries=1, args_validator=ANY_ARGUMENTS)

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        """The tools, or none once a lenient cap withdrew them (asked before every model turn)."""
        del ctx
        return {} if self._loop.withdrawn else self._tools

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> str:
        """Run one call through the choke point; its text is what the model reads."""
        del tool
        if not self._loop.admit(ctx.run_step):
            return TOOL_LIMIT_REACHED
        if self._run_tool is None:
            return NO_TOOL_RUNNER
        call = ToolCallRequest(call_id=ctx.tool_call_id or "", name=name, arguments_json=json.dumps(tool_args))
        return await self._run_tool(call)
