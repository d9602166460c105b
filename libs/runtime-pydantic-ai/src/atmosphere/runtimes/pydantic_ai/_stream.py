"""From PydanticAI to the platform: the conversation in, the streamed events and usage out."""

from __future__ import annotations

from collections.abc import AsyncIterable, Sequence
from typing import Any

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

from atmosphere.contracts.run.v1.run_pb2 import RunEvent, ToolCallDelta
from atmosphere.sdk import ChatMessage, StreamingSession, TokenUsage


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


class RoundUsage:
    """A run's tokens reported round by round, as the built-in runtime reports them.

    PydanticAI sums a run's usage as its model rounds go; each report sends what is new since the
    last one, so the client sees one `usage` event per round (before that round's tool calls run)
    and a budget counts each round as it happens.
    """

    def __init__(self, session: StreamingSession, model: str) -> None:
        """Report into `session`, naming `model`."""
        self._session = session
        self._model = model
        self._sent = (0, 0, 0)
        """Input, output and cached input tokens reported so far."""

    async def report(self, usage: RunUsage) -> None:
        """Send the tokens `usage` counts beyond what was reported (nothing when none)."""
        seen = (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens)
        new_input, new_output, new_cached = (now - before for now, before in zip(seen, self._sent, strict=True))
        if not new_input and not new_output:
            return
        self._sent = seen
        tokens = TokenUsage(
            input=new_input, output=new_output, cached_input=new_cached, total=new_input + new_output, model=self._model
        )
        await self._session.usage(tokens)


class Forwarder:
    """PydanticAI's event stream handler: text and tool-call argument deltas go to the session as they arrive.

    `forward_text` is off while a structured answer streams (the validated entity is sent
    instead); `tool_names`, when given, are the only tools whose argument deltas are forwarded (a
    hosted agent's output tool is not a tool call the client should see).
    """

    def __init__(
        self,
        session: StreamingSession,
        usage: RoundUsage,
        *,
        forward_text: bool = True,
        tool_names: frozenset[str] | None = None,
    ) -> None:
        """Forward into `session`; each model round's usage through `usage`, before the next round's events."""
        self._session = session
        self._usage = usage
        self._forward_text = forward_text
        self._tool_names = tool_names
        self._calls: dict[int, tuple[str, str]] = {}
        """The tool call of each part index of the response streaming now: (call id, tool name)."""

    async def __call__(self, ctx: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
        """Consume PydanticAI's events (a part's start precedes its deltas, so `_calls` stays current).

        PydanticAI calls this for each node that streams (a model request, then the tool calls it
        asked for): the rounds finished so far are reported first, so a round's usage precedes its
        tool calls, as on the built-in runtime.
        """
        await self._usage.report(ctx.usage)
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
