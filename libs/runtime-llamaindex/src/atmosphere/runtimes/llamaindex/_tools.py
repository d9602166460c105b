"""An Atmosphere agent's `ToolSpec`s as LlamaIndex tools, and the run's tool loop.

LlamaIndex sends a tool's `metadata.to_openai_tool()`; `SpecMetadata` makes that the schema the app
declared rather than one derived from a pydantic model. The calls themselves never reach a
`SpecTool`: the gated workflow (`_workflow`) hands each one to the choke point, which runs the
tool in the sandbox.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from llama_index.core.tools import AsyncBaseTool, ToolMetadata, ToolOutput

from atmosphere.bus import errors as catalogue
from atmosphere.sdk import OnMaxIterations, ToolLoopPolicy
from atmosphere.sdk.runtime import ToolSpec

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
    """Counts the run's tool rounds (model turns that asked for tools) against its `ToolLoopPolicy`.

    A strict cap fails the run at the first round past it, before any of that round's calls run; a
    lenient one refuses that round's calls and withdraws the tools, so the next turn answers with
    what it has.
    """

    policy: ToolLoopPolicy
    rounds: int = 0
    withdrawn: bool = False
    """A lenient cap was reached: calls are refused and no tools are offered any more."""

    def count(self) -> None:
        """Count a turn that asked for tools.

        Raises:
            ToolLoopExhaustedError: the turn is past a strict cap, or asks for tools again after a
                lenient cap withdrew them.
        """
        self.rounds += 1
        if self.rounds <= self.policy.cap:
            return
        if self.policy.on_max_iterations is OnMaxIterations.FAIL or self.withdrawn:
            raise ToolLoopExhaustedError(self.policy.cap)
        self.withdrawn = True

    @property
    def model_turns(self) -> int:
        """LlamaIndex's own iteration limit for the run: never reached before this loop decides.

        LlamaIndex counts every model turn, the answer's included, and fails when the count reaches
        the limit: the cap's rounds, one refused round and the answer take `cap + 2`.
        """
        return self.policy.cap + 3


@dataclass
class SpecMetadata(ToolMetadata):
    """A tool's metadata whose parameters are a JSON schema as declared, not a pydantic model's."""

    parameters: dict[str, Any] = field(default_factory=dict)

    def get_parameters_dict(self) -> dict[str, Any]:
        """A copy of the declared schema (the OpenAI LLM adds `additionalProperties` to what it gets)."""
        return copy.deepcopy(self.parameters)


class SpecTool(AsyncBaseTool):
    """An Atmosphere agent's tool as the model is offered it; the choke point runs its calls."""

    def __init__(self, spec: ToolSpec) -> None:
        """Offer `spec` with its own name, description and schema."""
        self.spec = spec
        self._metadata = SpecMetadata(
            description=spec.description, name=spec.name, fn_schema=None, parameters=spec.parameters
        )

    @property
    def metadata(self) -> ToolMetadata:
        """The name, description and schema the model sees."""
        return self._metadata

    def call(self, input: Any) -> ToolOutput:
        """Never called: the gated workflow sends the call to the choke point instead."""
        raise NotLocalError(self.spec.name)

    async def acall(self, input: Any) -> ToolOutput:
        """Never called: the gated workflow sends the call to the choke point instead."""
        raise NotLocalError(self.spec.name)


class NotLocalError(RuntimeError):
    """An Atmosphere agent's tool was called in this process rather than through the choke point."""

    def __init__(self, name: str) -> None:
        """Name the tool."""
        super().__init__(f"{name} runs in the sandbox, through the choke point, never in the runtime")
