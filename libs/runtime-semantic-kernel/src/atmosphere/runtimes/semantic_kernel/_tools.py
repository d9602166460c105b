"""The agent's `ToolSpec`s on Semantic Kernel: offered as declared, each call the model makes handed to `ctx.run_tool`.

The specs are not made kernel functions, because SK's function model cannot carry an app's tool
faithfully: a parameter's name must match `^[0-9A-Za-z_-]+$`, the schema the model is shown is
rebuilt from one schema per parameter (a top-level `$defs` or `additionalProperties` is lost), a
name with a dash is read as `plugin-function`, and the kernel checks a call's arguments against
the function's parameters before any filter runs, answering a misfit itself, so that call would
never reach the choke point. Instead the platform's chat service offers the specs as declared
(`_service`), and the run's kernel (`GatedKernel`) hands each call of SK's auto-invocation loop
to the choke point as the model made it (its id, name and JSON arguments), which validates it
against the very schema the model was shown. SK runs the calls of one model turn concurrently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import PrivateAttr
from semantic_kernel import Kernel
from semantic_kernel.connectors.ai.function_choice_behavior import FunctionChoiceBehavior
from semantic_kernel.connectors.ai.prompt_execution_settings import PromptExecutionSettings
from semantic_kernel.contents import ChatHistory, FunctionCallContent, FunctionResultContent
from semantic_kernel.filters import AutoFunctionInvocationContext
from semantic_kernel.functions import KernelArguments

from atmosphere.bus import errors as catalogue
from atmosphere.sdk import OnMaxIterations, ToolLoopPolicy
from atmosphere.sdk.runtime import ToolCallRequest, ToolRunner, ToolSpec

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

    SK's auto-invocation loop numbers its model requests (`request_index`); every request before
    the current one asked for tools, so the index is the number of tool rounds before this one.
    """

    policy: ToolLoopPolicy
    withdrawn: bool = False
    """A lenient cap was reached: no more tools are offered, so the model answers with what it has."""

    def behavior(self) -> FunctionChoiceBehavior:
        """SK's behaviour for the loop: automatic calls for the cap's rounds, one more (refused or failed), the answer.

        The loop's own count ends the run, not SK's: SK's streaming loop stops silently, with no
        final answer, once its attempts are spent.
        """
        return FunctionChoiceBehavior.Auto(maximum_auto_invoke_attempts=self.policy.cap + 2)

    def admit(self, round_index: int) -> bool:
        """Whether a call of the tool round `round_index` (from 0) may run.

        Raises:
            ToolLoopExhaustedError: the cap is strict and this round is one too many.
        """
        if round_index < self.policy.cap:
            return True
        if self.policy.on_max_iterations is OnMaxIterations.FAIL:
            raise ToolLoopExhaustedError(self.policy.cap)
        self.withdrawn = True
        return False


@dataclass(frozen=True)
class SpecOffer:
    """The tools a run built from `ctx` offers the model, and the loop that may withdraw them."""

    specs: tuple[ToolSpec, ...]
    loop: ToolLoop

    def definitions(self) -> list[dict[str, Any]]:
        """The tools as chat completions declares them: each spec's own name, description and schema."""
        return [
            {
                "type": "function",
                "function": {"name": spec.name, "description": spec.description, "parameters": spec.parameters},
            }
            for spec in self.specs
        ]


@dataclass(frozen=True)
class SpecGate:
    """Runs one call of the model's through the choke point, within the tool loop."""

    run_tool: ToolRunner | None
    loop: ToolLoop

    async def run(self, call: FunctionCallContent, round_index: int) -> str:
        """The text the model reads for `call`."""
        if not self.loop.admit(round_index):
            return TOOL_LIMIT_REACHED
        if self.run_tool is None:
            return NO_TOOL_RUNNER
        request = ToolCallRequest(call_id=call.id or "", name=call.name or "", arguments_json=arguments_json(call))
        return await self.run_tool(request)


def arguments_json(call: FunctionCallContent) -> str:
    """The call's arguments as the model sent them (JSON text; `{}` for none)."""
    arguments = call.arguments
    if isinstance(arguments, str):
        return arguments or "{}"
    return json.dumps(dict(arguments or {}))


class GatedKernel(Kernel):
    """The kernel of a run built from `ctx`: every call of its auto-invocation loop goes to the choke point."""

    _gate: SpecGate = PrivateAttr()

    def __init__(self, gate: SpecGate, **kwargs: Any) -> None:
        """A kernel whose function calls `gate` runs; `kwargs` are `Kernel`'s (its services)."""
        super().__init__(**kwargs)
        self._gate = gate

    async def invoke_function_call(
        self,
        function_call: FunctionCallContent,
        chat_history: ChatHistory,
        *,
        arguments: KernelArguments | None = None,
        execution_settings: PromptExecutionSettings | None = None,
        function_call_count: int | None = None,
        request_index: int | None = None,
        is_streaming: bool = False,
        function_behavior: FunctionChoiceBehavior | None = None,
    ) -> AutoFunctionInvocationContext | None:
        """Answer `function_call` with the choke point's text, added to `chat_history` as SK adds a result."""
        del arguments, execution_settings, function_call_count, function_behavior
        text = await self._gate.run(function_call, request_index or 0)
        result = FunctionResultContent.from_function_call_content_and_result(function_call, text)
        chat_history.add_message(
            result.to_streaming_chat_message_content() if is_streaming else result.to_chat_message_content()
        )
        return None  # never a request to end the loop: the loop's cap is `ToolLoop`'s
