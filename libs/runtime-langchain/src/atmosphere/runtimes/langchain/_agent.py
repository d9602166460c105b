"""An Atmosphere agent as a LangChain agent: `create_agent`, with the run's policies as its middleware.

LangChain's agent loop runs the rounds (model, then the tools it asked for, concurrently, then the
model again); two middlewares wrap each model call with what Atmosphere adds to that loop:

- `ToolLoop`, the run's `ToolLoopPolicy`: a reply asking for tools past the cap either ends the run
  (strict: `Tool loop exhausted after N iterations`, before any of its tools run) or has its calls
  refused and the model asked once more with no tools offered (lenient), as the built-in runtime does;
- `CallDeadline`: each model call ends at `RuntimeConfig.call_timeout`.

`own_graph` is the runtime's builder (`atmosphere.langchain_bridge.engine.OwnGraphBuilder`): the
bridge's engine runs the agent it returns. This module imports LangChain: only a run imports it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, ToolMessage
from langchain_core.tools import BaseTool
from langgraph.graph.state import CompiledStateGraph

from atmosphere.langchain_bridge.engine import OwnGraph
from atmosphere.langchain_bridge.failures import ToolLoopExhaustedError, within_deadline
from atmosphere.langchain_bridge.provider import Provider
from atmosphere.langchain_bridge.relay import conversation
from atmosphere.langchain_bridge.tools import TOOL_LIMIT_REACHED, agent_tools
from atmosphere.sdk import OnMaxIterations, ToolLoopPolicy
from atmosphere.sdk.runtime import AgentExecutionContext

ModelHandler = Callable[[ModelRequest[None]], Awaitable[ModelResponse[Any]]]


def own_graph(provider: Provider, ctx: AgentExecutionContext) -> OwnGraph:
    """The Atmosphere agent as this run's LangChain agent: its prompt, tools and tool-loop policy."""
    agent = langchain_agent(
        provider.chat_model(ctx),
        agent_tools(ctx),
        ctx.request.system_prompt,
        ctx.tool_loop,
        call_timeout=provider.config.call_timeout,
    )
    return OwnGraph(agent, {"messages": conversation(ctx.request)}, {})


def langchain_agent(
    model: BaseChatModel, tools: Sequence[BaseTool], system_prompt: str, policy: ToolLoopPolicy, *, call_timeout: float
) -> CompiledStateGraph[AgentState[Any], None, Any, Any]:
    """The LangChain agent of one run (its input: `{"messages": [...]}`)."""
    # The first middleware is the outermost: the policy sees each call whole, deadline included.
    middleware = [ToolLoop(policy), CallDeadline(call_timeout)]
    return create_agent(model, list(tools), system_prompt=system_prompt or None, middleware=middleware)


class ToolLoop(AgentMiddleware):
    """The run's `ToolLoopPolicy`, applied to each reply that asks for tools."""

    def __init__(self, policy: ToolLoopPolicy) -> None:
        """Apply `policy`."""
        self._policy = policy

    async def awrap_model_call(self, request: ModelRequest[None], handler: ModelHandler) -> ModelResponse[Any]:
        """Call the model; past the cap, fail or refuse the calls and ask again without tools."""
        response = await handler(request)
        reply = _reply(response.result)
        if reply is None or not reply.tool_calls or _tool_rounds(request.messages) < self._policy.cap:
            return response
        if self._policy.on_max_iterations is OnMaxIterations.FAIL:
            raise ToolLoopExhaustedError(self._policy.cap)
        refusals = [ToolMessage(TOOL_LIMIT_REACHED, tool_call_id=call["id"]) for call in reply.tool_calls]
        # The reply (without a response format, the result is the reply alone) and a refusal per call.
        answered: list[AnyMessage] = [reply, *refusals]
        final = await handler(request.override(messages=[*request.messages, *answered], tools=[]))
        return ModelResponse(result=[*answered, *(_without_tool_calls(m) for m in final.result)])


class CallDeadline(AgentMiddleware):
    """Each model call, cut at the configured deadline (a stream of keep-alives must not hold the run)."""

    def __init__(self, seconds: float) -> None:
        """Cut calls at `seconds`."""
        self._seconds = seconds

    async def awrap_model_call(self, request: ModelRequest[None], handler: ModelHandler) -> ModelResponse[Any]:
        """Call the model within the deadline."""
        return await within_deadline(self._seconds, handler(request))


def _reply(messages: Sequence[BaseMessage]) -> AIMessage | None:
    return next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)


def _tool_rounds(messages: Sequence[AnyMessage]) -> int:
    """The model's replies that asked for tools (the history going in holds none: it is text only)."""
    return sum(1 for m in messages if isinstance(m, AIMessage) and m.tool_calls)


def _without_tool_calls(message: BaseMessage) -> BaseMessage:
    """The answer of the round offered no tools: calls it asks for anyway would loop back to the tools."""
    if isinstance(message, AIMessage) and message.tool_calls:
        return message.model_copy(update={"tool_calls": [], "invalid_tool_calls": []})
    return message
