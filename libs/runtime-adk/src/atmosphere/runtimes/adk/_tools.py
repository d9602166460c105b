"""The agent's `ToolSpec`s as ADK tools whose every call goes to `ctx.run_tool`, within the tool loop.

ADK validates nothing itself: a call's arguments reach the choke point as the model sent them,
and the choke point validates them against the very schema the model was shown (reporting a
misfit as the call's result, as for every runtime). ADK runs the calls of one model turn
concurrently.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from google.adk.tools.base_tool import BaseTool
from google.adk.tools.tool_context import ToolContext
from google.genai import types

from atmosphere.runtimes.adk._errors import ToolLoopExhaustedRunError
from atmosphere.sdk import OnMaxIterations, ToolLoopPolicy
from atmosphere.sdk.runtime import ToolCallRequest, ToolRunner, ToolSpec
from atmosphere.sdk.runtime_errors import NO_TOOL_RUNNER, TOOL_LIMIT_REACHED


@dataclass
class ToolLoop:
    """Counts the run's tool rounds (model turns that asked for tools) against its `ToolLoopPolicy`."""

    policy: ToolLoopPolicy
    withdrawn: bool = False
    """A lenient cap was reached: the model may call no more tools, so it answers with what it has."""
    _rounds: list[int] = field(default_factory=list)

    def admit(self, model_round: int) -> bool:
        """Whether a call asked for in model round `model_round` may run (the calls of one turn share it).

        Raises:
            ToolLoopExhaustedRunError: the cap is strict and this turn is one round too many.
        """
        if model_round not in self._rounds:
            self._rounds.append(model_round)
        if self._rounds.index(model_round) < self.policy.cap:
            return True
        if self.policy.on_max_iterations is OnMaxIterations.FAIL:
            raise ToolLoopExhaustedRunError(self.policy.cap)
        self.withdrawn = True
        return False


class SpecTool(BaseTool):
    """One of the run's tools as the model sees it; a call is the choke point's to run."""

    def __init__(
        self, spec: ToolSpec, run_tool: ToolRunner | None, loop: ToolLoop, model_round: Callable[[], int]
    ) -> None:
        """Offer `spec`; run each call with `run_tool`, as far as `loop` admits it in the current `model_round`."""
        super().__init__(name=spec.name, description=spec.description)
        self._spec = spec
        self._run_tool = run_tool
        self._loop = loop
        self._model_round = model_round

    def _get_declaration(self) -> types.FunctionDeclaration:
        # The schema goes out as the app declared it (JSON Schema), not rewritten into OpenAPI's subset.
        return types.FunctionDeclaration(
            name=self._spec.name, description=self._spec.description, parameters_json_schema=self._spec.parameters
        )

    async def run_async(self, *, args: dict[str, Any], tool_context: ToolContext) -> str:
        """Run one call through the choke point; its text is what the model reads."""
        if not self._loop.admit(self._model_round()):
            return TOOL_LIMIT_REACHED
        if self._run_tool is None:
            return NO_TOOL_RUNNER
        call = ToolCallRequest(
            call_id=tool_context.function_call_id or "", name=self.name, arguments_json=json.dumps(args)
        )
        return await self._run_tool(call)
