"""Tools on AgentScope's loop, every call of which goes to the platform's choke point (`ctx.run_tool`).

AgentScope runs every tool call through its toolkit's `call_tool` (after validating the arguments
against the tool's schema and asking its permission engine): `GatedToolkit` overrides that one
method, so a gated tool's call becomes a `ToolCallRequest` for the choke point, with the call id
the model gave it. The gated tools are an Atmosphere agent's `ToolSpec`s (declarations: the choke
point runs them) or a hosted agent's own tools (`local` set: the choke point runs the tool itself
once every gate passed). AgentScope's own plan, tool-group and skill tools run inside the loop.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agentscope.agent import Agent
from agentscope.message import TextBlock, ToolCallBlock, ToolResultState
from agentscope.middleware import MiddlewareBase
from agentscope.model import ChatResponse
from agentscope.permission import PermissionBehavior, PermissionContext, PermissionDecision
from agentscope.state import AgentState
from agentscope.tool import MCPTool, ToolBase, ToolChunk, Toolkit, ToolResponse

from atmosphere.bus import errors as catalogue
from atmosphere.sdk import OnMaxIterations, ToolLoopPolicy
from atmosphere.sdk.runtime import LocalTool, ToolCallRequest, ToolRunner, ToolSpec

NO_TOOL_RUNNER = "Error: no tool runner is attached to this run"
"""The built-in runtime's text for a tool call on a run that cannot run tools."""
TOOL_LIMIT_REACHED = "Error: the tool-call limit for this request was reached; answer with what you have"
"""The built-in runtime's text for a call refused by a lenient tool loop's cap."""
ALLOWED = PermissionDecision(behavior=PermissionBehavior.ALLOW, message="The platform's choke point gates this call.")


class ToolLoopExhaustedError(Exception):
    """A strict tool loop's cap was reached and the model still asked for tools."""

    code = catalogue.ToolLoopExhaustedError.code

    def __init__(self, cap: int) -> None:
        """The built-in runtime's words for a strict cap of `cap` rounds."""
        super().__init__(f"Tool loop exhausted after {cap} iterations")


@dataclass
class ToolLoop:
    """Counts the run's tool rounds (model rounds that asked for tools) against its `ToolLoopPolicy`."""

    policy: ToolLoopPolicy
    rounds: int = 0

    def asked(self) -> None:
        """A model round asked for tools.

        Raises:
            ToolLoopExhaustedError: the cap is strict and this round is one too many.
        """
        self.rounds += 1
        if self.refuses and self.policy.on_max_iterations is OnMaxIterations.FAIL:
            raise ToolLoopExhaustedError(self.policy.cap)

    @property
    def refuses(self) -> bool:
        """A lenient cap was passed: this round's calls are refused and the next rounds offer no tools."""
        return self.rounds > self.policy.cap


class LoopGuard(MiddlewareBase):
    """Holds an Atmosphere agent's run to its tool loop: counts each round, withdraws the tools past the cap."""

    def __init__(self, loop: ToolLoop) -> None:
        """Guard `loop`."""
        self.loop = loop

    async def on_reasoning(
        self, agent: Agent, input_kwargs: dict[str, Any], next_handler: Callable[..., AsyncGenerator[Any, None]]
    ) -> AsyncGenerator[Any, None]:
        """The round as it streams; then, if it asked for tools, count it (before they run)."""
        async for event in next_handler(**input_kwargs):
            yield event
        if agent.state.get_unfinished_tool_calls(agent.name):
            self.loop.asked()

    async def on_model_call(
        self, agent: Agent, input_kwargs: dict[str, Any], next_handler: Callable[..., Awaitable[Any]]
    ) -> ChatResponse | AsyncGenerator[ChatResponse, None]:
        """The model call, without tools once the cap withdrew them (so the model answers with what it has)."""
        del agent
        if self.loop.refuses:
            input_kwargs = {**input_kwargs, "tools": []}
        answer: ChatResponse | AsyncGenerator[ChatResponse, None] = await next_handler(**input_kwargs)
        return answer


def object_schema(parameters: dict[str, Any]) -> dict[str, Any]:
    """A tool's parameters as AgentScope registers them (it insists on an object with `properties`)."""
    return {"type": "object", "properties": {}, **parameters}


class DeclaredTool(ToolBase):
    """An Atmosphere agent's tool as AgentScope offers it: the choke point runs it, never this."""

    is_external_tool = False

    def __init__(self, spec: ToolSpec) -> None:
        """Declare `spec` (its calls may run concurrently: the choke point decides how)."""
        super().__init__()
        self.name = spec.name
        self.description = spec.description
        self.input_schema = object_schema(spec.parameters)
        self.is_concurrency_safe = True
        self.is_read_only = False

    async def check_permissions(self, tool_input: dict[str, Any], context: PermissionContext) -> PermissionDecision:
        """Always allowed here: governance and approval are the choke point's."""
        del tool_input, context
        return ALLOWED

    async def call(self, *args: Any, **kwargs: Any) -> ToolChunk:
        """Never called: `GatedToolkit` hands the call to the choke point."""
        del args, kwargs
        msg = f"{self.name} runs only through the platform's choke point"
        raise RuntimeError(msg)


class PermittedTool(ToolBase):
    """A hosted agent's own tool, gated by the platform: AgentScope's confirmation gives way to the choke point.

    AgentScope asks a user to confirm every custom function tool unless it was allowed; a hosted
    agent's calls are governed and approved by the choke point instead (the operator's tool
    permissions, `requires_approval`), so this allows what the tool itself does not deny. The
    agent's own deny rules, and a tool's own denial, still refuse a call before it reaches the gate.
    """

    def __init__(self, tool: ToolBase) -> None:
        """Stand for `tool` (everything but the permission is the tool's)."""
        super().__init__()
        self.tool = tool
        self.name = tool.name
        self.description = tool.description
        self.input_schema = tool.input_schema
        self.is_concurrency_safe = tool.is_concurrency_safe
        self.is_read_only = tool.is_read_only
        self.is_external_tool = tool.is_external_tool
        self.is_state_injected = tool.is_state_injected
        self.metadata_schema = tool.metadata_schema

    async def check_permissions(self, tool_input: dict[str, Any], context: PermissionContext) -> PermissionDecision:
        """The tool's own denial, else allowed (the choke point gates the call)."""
        decision = await self.tool.check_permissions(tool_input, context)
        return decision if decision.behavior is PermissionBehavior.DENY else ALLOWED

    async def check_read_only(self, tool_input: dict[str, Any]) -> bool:
        """The tool's own answer."""
        return await self.tool.check_read_only(tool_input)

    async def match_rule(self, rule_content: str | None, tool_input: dict[str, Any]) -> bool:
        """The tool's own matching of the agent's permission rules."""
        return await self.tool.match_rule(rule_content, tool_input)

    async def call(self, **kwargs: Any) -> ToolChunk | AsyncGenerator[ToolChunk, None]:
        """Run the tool itself (through its own middlewares): only ever as the choke point's `local`."""
        result: ToolChunk | AsyncGenerator[ToolChunk, None] = await self.tool(**kwargs)
        return result


class GatedToolkit(Toolkit):
    """A toolkit whose gated tools' calls go to the choke point; AgentScope's own tools run as they do.

    A call to a `DeclaredTool` goes to `run_tool` as it is; a call to a `PermittedTool` carries
    `local`, which runs the tool with the arguments the gates let through. An MCP server's tool
    goes to the choke point too, which refuses a tool it does not know. While `loop` refuses,
    every call is answered with the built-in runtime's refusal instead.
    """

    def __init__(self, run_tool: ToolRunner | None, loop: ToolLoop | None = None, **toolkit: Any) -> None:
        """A toolkit of `toolkit` (`Toolkit`'s arguments) whose gated calls go to `run_tool`."""
        super().__init__(**toolkit)
        self._run_tool = run_tool
        self._loop = loop

    async def call_tool(
        self, tool_call: ToolCallBlock, state: AgentState
    ) -> AsyncGenerator[ToolChunk | ToolResponse, None]:
        """Answer one call: through the choke point when the tool is gated, else as AgentScope runs it."""
        if self._loop is not None and self._loop.refuses:
            async for item in answer(tool_call.id, TOOL_LIMIT_REACHED):
                yield item
            return
        tool = await self.get_tool(tool_call.name)
        if not isinstance(tool, DeclaredTool | PermittedTool | MCPTool):
            async for item in super().call_tool(tool_call, state):
                yield item
            return
        if self._run_tool is None:
            text = NO_TOOL_RUNNER
        else:
            local = self._local(tool_call, state) if isinstance(tool, PermittedTool) else None
            request = ToolCallRequest(tool_call.id, tool_call.name, tool_call.input or "{}", local=local)
            text = await self._run_tool(request)
        async for item in answer(tool_call.id, text):
            yield item

    def _local(self, tool_call: ToolCallBlock, state: AgentState) -> LocalTool:
        async def run(arguments_json: str) -> str:
            approved = tool_call.model_copy(update={"input": arguments_json})
            response = ToolResponse(id=tool_call.id)
            async for item in Toolkit.call_tool(self, approved, state):
                if isinstance(item, ToolResponse):
                    response = item
            text = "".join(block.text for block in response.content if isinstance(block, TextBlock))
            if response.state is ToolResultState.ERROR and not text.startswith("Error"):
                return f"Error: {text}"  # AgentScope's report of a failing tool, marked as one
            return text

        return run


async def answer(call_id: str, text: str) -> AsyncGenerator[ToolChunk | ToolResponse, None]:
    """A tool result as AgentScope's toolkit streams one: the chunk, then the whole response."""
    state = ToolResultState.ERROR if text.startswith("Error") else ToolResultState.RUNNING
    chunk = ToolChunk(content=[TextBlock(text=text)], state=state)
    yield chunk
    yield ToolResponse(id=call_id).append_chunk(chunk)
