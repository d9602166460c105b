"""From AgentScope to the platform: the conversation in, the agent's events out."""

from __future__ import annotations

from collections.abc import Sequence

from agentscope.event import (
    ModelCallEndEvent,
    RequireExternalExecutionEvent,
    RequireUserConfirmEvent,
    TextBlockDeltaEvent,
    ToolCallDeltaEvent,
    ToolCallStartEvent,
    ToolResultEndEvent,
)
from agentscope.message import AssistantMsg, Msg, SystemMsg, UserMsg
from agentscope.state import AgentState

from atmosphere.bus import errors as catalogue
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, ToolCallDelta
from atmosphere.runtimes.agentscope._plan import PlanBridge
from atmosphere.sdk import ChatMessage, StreamingSession, TokenUsage


def as_context(history: Sequence[ChatMessage], agent: str) -> list[Msg]:
    """The platform's history as an AgentScope context, in order.

    A `tool` message of the history has no call to answer any more, so it is read as user text;
    a system message (a summary memory made of older turns) stays where it is.
    """
    context: list[Msg] = []
    for message in history:
        if message.role == "assistant":
            context.append(AssistantMsg(name=agent, content=message.content))
        elif message.role == "system":
            context.append(SystemMsg(name="system", content=message.content))
        else:
            context.append(UserMsg(name="user", content=message.content))
    return context


class ConfirmationAskedError(Exception):
    """The hosted agent stopped to ask a user to confirm (or run) a tool call: the platform approves instead."""

    code = catalogue.RuntimeFailedError.code

    def __init__(self, names: Sequence[str]) -> None:
        """Name the calls, and what to do instead."""
        super().__init__(
            f"the AgentScope agent stopped to ask for a confirmation of {', '.join(names)} (its permission rules "
            "or an external tool); a hosted agent's calls are approved by the platform: allow the tool in "
            "AgentScope and let the operator's tool permissions (ATMOSPHERE_TOOLS__PERMISSIONS) ask for a confirmation"
        )


class Forwarder:
    """Sends an AgentScope agent's events to the session as they arrive.

    Text deltas stream as text, the argument deltas of the run's own tools (`tool_names`) as
    `tool_call_delta` events, each model round's usage once it ended (before its tools run, as
    on the built-in runtime); after each tool result the plan bridge, if any, mirrors the task list.
    """

    def __init__(
        self,
        session: StreamingSession,
        state: AgentState,
        *,
        model: str,
        tool_names: frozenset[str],
        plan: PlanBridge | None = None,
    ) -> None:
        """Forward the run whose agent keeps `state`, on `model`."""
        self._session = session
        self._state = state
        self._model = model
        self._tool_names = tool_names
        self._plan = plan
        self._calls: dict[str, str] = {}
        """The tool name of each call id that started streaming."""

    async def forward(self, event: object) -> None:
        """Send what `event` means to the client (events that mean nothing to it are dropped).

        Raises:
            ConfirmationAskedError: the agent parked its reply on a user's confirmation.
        """
        if isinstance(event, TextBlockDeltaEvent):
            if event.delta:
                await self._session.send(event.delta)
        elif isinstance(event, ToolCallStartEvent):
            self._calls[event.tool_call_id] = event.tool_call_name
        elif isinstance(event, ToolCallDeltaEvent):
            await self._arguments(event.tool_call_id, event.delta)
        elif isinstance(event, ModelCallEndEvent):
            await self._usage(event)
        elif isinstance(event, ToolResultEndEvent):
            if self._plan is not None:
                await self._plan.sync(self._state.tasks_context.tasks, event.tool_call_id)
        elif isinstance(event, RequireUserConfirmEvent | RequireExternalExecutionEvent):
            raise ConfirmationAskedError([call.name for call in event.tool_calls])

    async def _arguments(self, call_id: str, fragment: str) -> None:
        name = self._calls.get(call_id, "")
        if fragment and name in self._tool_names:
            delta = ToolCallDelta(call_id=call_id, tool_name=name, arguments_fragment=fragment)
            await self._session.emit(RunEvent(tool_call_delta=delta))

    async def _usage(self, event: ModelCallEndEvent) -> None:
        if not event.input_tokens and not event.output_tokens:
            return
        tokens = TokenUsage(
            input=event.input_tokens,
            output=event.output_tokens,
            cached_input=event.cache_input_tokens,
            total=event.input_tokens + event.output_tokens,
            model=self._model,
        )
        await self._session.usage(tokens)
