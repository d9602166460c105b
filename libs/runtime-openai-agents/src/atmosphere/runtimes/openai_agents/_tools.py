"""The agent's `ToolSpec`s as Agents SDK function tools whose every call goes to `ctx.run_tool`, within the tool loop.

The SDK hands a tool the model's arguments as JSON text, which go to the choke point as they
are (it validates them against the schema the model was shown). The SDK runs the calls of one
model turn concurrently.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from agents import Agent, FunctionTool, ModelResponse, RunContextWrapper, RunHooks
from agents.tool_context import ToolContext
from openai.types.responses import ResponseFunctionToolCall

from atmosphere.bus import errors as catalogue
from atmosphere.sdk import OnMaxIterations, ToolLoopPolicy
from atmosphere.sdk.runtime import ToolCallRequest, ToolRunner, ToolSpec

NO_TOOL_RUNNER = "Error: no tool runner is attached to this run"
"""The built-in runtime's text for a tool call on a run that cannot run tools."""
TOOL_LIMIT_REACHED = "Error: the tool-call limit for this request was reached; answer with what you have"
"""The built-in runtime's text for a call refused by a lenient tool loop's cap."""

Invoke = Callable[[ToolContext[Any], str], Awaitable[Any]]
"""How the SDK calls a function tool: its context and the model's arguments as JSON."""


class ToolLoopExhaustedError(Exception):
    """A strict tool loop's cap was reached and the model still asked for tools."""

    code = catalogue.ToolLoopExhaustedError.code

    def __init__(self, cap: int) -> None:
        """The built-in runtime's words for a strict cap of `cap` rounds."""
        super().__init__(f"Tool loop exhausted after {cap} iterations")


class Escalation:
    """Keeps what the choke point raised (a platform failure that must end the run as raised).

    The SDK turns an exception of a tool into a `UserError` naming the tool; the run's end
    re-raises the original, so dispatch sees its own error.
    """

    def __init__(self) -> None:
        """Nothing raised yet."""
        self.error: Exception | None = None

    async def run(self, run_tool: ToolRunner, call: ToolCallRequest) -> str:
        """`run_tool(call)`, remembering the first exception it raises."""
        try:
            return await run_tool(call)
        except Exception as exc:
            if self.error is None:
                self.error = exc
            raise


class ToolLoop(RunHooks[Any]):
    """Counts the run's tool rounds (model turns that asked for tools) against its `ToolLoopPolicy`.

    A run hook, because the SDK reports each model answer there before it runs the answer's tools:
    a strict cap fails the run at once; a lenient one refuses that turn's calls and then offers
    no more tools (`offered`), so the next turn answers with what it has.
    """

    def __init__(self, policy: ToolLoopPolicy) -> None:
        """Count against `policy`."""
        self.policy = policy
        self.rounds = 0
        self._refusing = False
        self._withdrawn = False

    async def on_llm_end(self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse) -> None:
        """Count a turn that asks for tools; one past the cap fails (strict) or is refused (lenient)."""
        del context, agent
        if not any(isinstance(item, ResponseFunctionToolCall) for item in response.output):
            return
        self.rounds += 1
        if self.rounds <= self.policy.cap:
            return
        if self.policy.on_max_iterations is OnMaxIterations.FAIL:
            raise ToolLoopExhaustedError(self.policy.cap)
        self._refusing = True

    def offered(self, context: RunContextWrapper[Any], agent: Any) -> bool:
        """Whether the tools are offered (the SDK asks before each turn, and again before running its calls)."""
        del context, agent
        return not self._withdrawn

    def refuses(self) -> bool:
        """Whether a call of this turn is refused; the tools are withdrawn once the turn's calls run."""
        if self._refusing:
            self._withdrawn = True  # the turn's calls were admitted as enabled: hide the tools from the next turn
        return self._refusing


def spec_tools(
    specs: tuple[ToolSpec, ...], run_tool: ToolRunner | None, loop: ToolLoop, escalation: Escalation
) -> list[FunctionTool]:
    """The run's tools as the model sees them; a call is the choke point's to run."""
    return [
        FunctionTool(
            name=spec.name,
            description=spec.description,
            params_json_schema=spec.parameters,
            on_invoke_tool=_invoker(spec.name, run_tool, loop, escalation),
            strict_json_schema=False,  # the schema goes out as the app declared it, not rewritten for strict mode
            is_enabled=loop.offered,
        )
        for spec in specs
    ]


def _invoker(name: str, run_tool: ToolRunner | None, loop: ToolLoop, escalation: Escalation) -> Invoke:
    async def invoke(context: ToolContext[Any], arguments: str) -> str:
        if loop.refuses():
            return TOOL_LIMIT_REACHED
        if run_tool is None:
            return NO_TOOL_RUNNER
        call = ToolCallRequest(call_id=context.tool_call_id, name=name, arguments_json=arguments or "{}")
        return await escalation.run(run_tool, call)

    return invoke
