"""From the Agents SDK to the platform: the conversation in, the streamed events and usage out."""

from __future__ import annotations

from collections.abc import Sequence

from agents import RawResponsesStreamEvent, StreamEvent, TResponseInputItem, Usage
from openai.types.responses import (
    EasyInputMessageParam,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionToolCall,
    ResponseOutputItemAddedEvent,
    ResponseTextDeltaEvent,
)

from atmosphere.contracts.run.v1.run_pb2 import RunEvent, ToolCallDelta
from atmosphere.sdk import ChatMessage, StreamingSession, TokenUsage


def as_input(messages: Sequence[ChatMessage]) -> list[TResponseInputItem]:
    """The platform's messages as the SDK's input items, in order.

    A `tool` message of the history has no call to answer any more, so it is read as user text.
    """
    return [EasyInputMessageParam(role="user" if m.role == "tool" else m.role, content=m.content) for m in messages]


def token_usage(usage: Usage, model: str) -> TokenUsage | None:
    """The run's tokens, summed by the SDK over its model calls; None when none were reported."""
    if not usage.input_tokens and not usage.output_tokens:
        return None
    return TokenUsage(
        input=usage.input_tokens,
        output=usage.output_tokens,
        cached_input=usage.input_tokens_details.cached_tokens,
        total=usage.input_tokens + usage.output_tokens,
        model=model,
    )


class Forwarder:
    """Text and tool-call argument deltas of the SDK's raw model events go to the session as they arrive.

    The SDK reports chat completions in the Responses API's event shapes; an arguments delta
    names its call by output index only, so the call each index opened is remembered. With
    `tool_names`, only those tools' argument deltas are forwarded (a handoff is no tool call).
    """

    def __init__(self, session: StreamingSession, *, tool_names: frozenset[str] | None = None) -> None:
        """Forward into `session`."""
        self._session = session
        self._tool_names = tool_names
        self._calls: dict[int, tuple[str, str]] = {}
        """The tool call of each output index of the answer streaming now: (call id, tool name)."""

    async def forward(self, event: StreamEvent) -> None:
        """Send what `event` adds to the answer, if anything."""
        if not isinstance(event, RawResponsesStreamEvent):
            return
        data = event.data
        if isinstance(data, ResponseTextDeltaEvent):
            if data.delta:
                await self._session.send(data.delta)
        elif isinstance(data, ResponseOutputItemAddedEvent) and isinstance(data.item, ResponseFunctionToolCall):
            self._calls[data.output_index] = (data.item.call_id, data.item.name)
            await self._arguments(data.output_index, data.item.arguments)
        elif isinstance(data, ResponseFunctionCallArgumentsDeltaEvent):
            await self._arguments(data.output_index, data.delta)

    async def _arguments(self, index: int, fragment: str) -> None:
        call = self._calls.get(index)
        if not fragment or call is None or (self._tool_names is not None and call[1] not in self._tool_names):
            return
        call_id, name = call
        delta = ToolCallDelta(call_id=call_id, tool_name=name, arguments_fragment=fragment)
        await self._session.emit(RunEvent(tool_call_delta=delta))
