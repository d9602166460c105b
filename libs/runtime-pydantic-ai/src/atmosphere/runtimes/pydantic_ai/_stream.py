"""From PydanticAI to the platform: the conversation in, the streamed events and usage out."""

from __future__ import annotations

from collections.abc import AsyncIterable, Sequence
from typing import Any

from atmosphere.contracts.run.v1.run_pb2 import RunEvent, ToolCallDelta
from atmosphere.sdk import ChatMessage, StreamingSession, TokenUsage
from pydantic_ai import RunContext
from pydantic_ai.messages import (
    AgentStreamEvent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    PartDeltaEvent,
    PartStartEvent,
    SystemPromptPart,
    TextPart,
    TextPartDelta,
    ToolCallPart,
    ToolCallPartDelta,
    UserPromptPart,
)
from pydantic_ai.usage import RunUsage


def as_messages(messages: Sequence[ChatMessage]) -> list[ModelMessage]:
    """The platform's messages as PydanticAI's, in order: assistant turns as responses, the rest as requests.

    A `tool` message of the history has no call to answer any more, so it is read as user text.
    """
    converted: list[ModelMessage] = []
    for message in messages:
        if message.role == "assistant":
            converted.append(ModelResponse(parts=[TextPart(content=message.content)]))
        elif message.role == "system":
            converted.append(ModelRequest(parts=[SystemPromptPart(content=message.content)]))
        else:
            converted.append(ModelRequest(parts=[UserPromptPart(content=message.content)]))
    return converted


def token_usage(usage: RunUsage, model: str) -> TokenUsage | None:
    """The run's tokens, summed over its model rounds; None when no round reported any."""
    if not usage.input_tokens and not usage.output_tokens:
        return None
    return TokenUsage(
        input=usage.input_tokens,
        output=usage.output_tokens,
        cached_input=usage.cache_read_tokens,
        total=usage.input_tokens + usage.output_tokens,
        model=model,
    )


class Forwarder:
    """PydanticAI's event stream handler: text and tool-call argument deltas go to the session as they arrive.

    `forward_text` is off while a structured answer streams (the validated entity is sent
    instead); `tool_names`, when given, are the only tools whose argument deltas are forwarded (a
    hosted agent's output tool is not a tool call the client should see).
    """

    def __init__(
        self, session: StreamingSession, *, forward_text: bool = True, tool_names: frozenset[str] | None = None
    ) -> None:
        """Forward into `session`."""
        self._session = session
        self._forward_text = forward_text
        self._tool_names = tool_names
        self._calls: dict[int, tuple[str, str]] = {}
        """The tool call of each part index of the response streaming now: (call id, tool name)."""

    async def __call__(self, ctx: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
        """Consume PydanticAI's events (a part's start precedes its deltas, so `_calls` stays current)."""
        del ctx
        async for event in events:
            if isinstance(event, PartStartEvent):
                await self._started(event)
            elif isinstance(event, PartDeltaEvent):
                await self._delta(event)

    async def _started(self, event: PartStartEvent) -> None:
        part = event.part
        if isinstance(part, TextPart):
            await self._text(part.content)
        elif isinstance(part, ToolCallPart):
            self._calls[event.index] = (part.tool_call_id, part.tool_name)
            if isinstance(part.args, str):
                await self._arguments(event.index, part.args)

    async def _delta(self, event: PartDeltaEvent) -> None:
        delta = event.delta
        if isinstance(delta, TextPartDelta):
            await self._text(delta.content_delta)
        elif isinstance(delta, ToolCallPartDelta) and isinstance(delta.args_delta, str):
            await self._arguments(event.index, delta.args_delta)

    async def _text(self, text: str) -> None:
        if text and self._forward_text:
            await self._session.send(text)

    async def _arguments(self, index: int, fragment: str) -> None:
        call = self._calls.get(index)
        if not fragment or call is None or (self._tool_names is not None and call[1] not in self._tool_names):
            return
        call_id, name = call
        delta = ToolCallDelta(call_id=call_id, tool_name=name, arguments_fragment=fragment)
        await self._session.emit(RunEvent(tool_call_delta=delta))
