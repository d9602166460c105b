"""From the Agents SDK to the platform: the conversation in, the streamed events and usage out."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from agents import (
    Agent,
    ModelResponse,
    RawResponsesStreamEvent,
    RunContextWrapper,
    RunHooks,
    StreamEvent,
    TResponseInputItem,
    Usage,
)
from openai.types.responses import (
    EasyInputMessageParam,
    ResponseCompletedEvent,
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


class Forwarder:
    """Text and tool-call argument deltas of the SDK's raw model events go to the session as they arrive.

    The SDK reports chat completions in the Responses API's event shapes; an arguments delta
    names its call by output index only, so the call each index opened is remembered. With
    `tool_names`, only those tools' argument deltas are forwarded (a handoff is no tool call).
    """

    def __init__(self, session: StreamingSession, model: str, *, tool_names: frozenset[str] | None = None) -> None:
        """Forward into `session`; usage is reported as `model`'s."""
        self._session = session
        self._model = model
        self._tool_names = tool_names
        self._calls: dict[int, tuple[str, str]] = {}
        """The tool call of each output index of the answer streaming now: (call id, tool name)."""
        self._reported = (0, 0, 0)
        """Input, output and cached input tokens reported so far."""
        self._answers = 0
        """Model answers forwarded to their end."""
        self._forwarded = asyncio.Condition()

    async def caught_up(self, answers: int) -> None:
        """Wait until the first `answers` model answers were forwarded to their end (their usage included)."""
        async with self._forwarded:
            await self._forwarded.wait_for(lambda: self._answers >= answers)

    async def report_rest(self, usage: Usage) -> None:
        """Report what the SDK counted for the run beyond what the answers' own usage said (nothing, usually)."""
        await self._report(usage.input_tokens, usage.output_tokens, usage.input_tokens_details.cached_tokens)

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
        elif isinstance(data, ResponseCompletedEvent):
            await self._completed(data)

    async def _completed(self, event: ResponseCompletedEvent) -> None:
        """One model answer ended: its tokens are reported (one `usage` a round, as on the built-in runtime)."""
        usage = event.response.usage
        if usage is not None:
            input_tokens, output_tokens, cached = self._reported
            details = usage.input_tokens_details
            await self._report(
                input_tokens + usage.input_tokens,
                output_tokens + usage.output_tokens,
                cached + (details.cached_tokens if details is not None else 0),
            )
        async with self._forwarded:
            self._answers += 1
            self._forwarded.notify_all()

    async def _report(self, input_tokens: int, output_tokens: int, cached: int) -> None:
        """Send the tokens beyond those reported, given the run's totals so far (nothing when none are new)."""
        before = self._reported
        new_input, new_output, new_cached = input_tokens - before[0], output_tokens - before[1], cached - before[2]
        if new_input <= 0 and new_output <= 0:
            return
        self._reported = (input_tokens, output_tokens, cached)
        tokens = TokenUsage(
            input=new_input,
            output=new_output,
            cached_input=max(0, new_cached),
            total=new_input + new_output,
            model=self._model,
        )
        await self._session.usage(tokens)

    async def _arguments(self, index: int, fragment: str) -> None:
        call = self._calls.get(index)
        if not fragment or call is None or (self._tool_names is not None and call[1] not in self._tool_names):
            return
        call_id, name = call
        delta = ToolCallDelta(call_id=call_id, tool_name=name, arguments_fragment=fragment)
        await self._session.emit(RunEvent(tool_call_delta=delta))


class Rounds(RunHooks[Any]):
    """Holds each model round back until its stream was forwarded, then lets the tool loop see it.

    The SDK runs the agent in a task of its own and queues the answer's events for the consumer;
    without this, a round's tool calls could reach the choke point (and the client its
    `tool-start`) before the consumer forwarded that round's argument deltas and usage. The SDK
    awaits `on_llm_end` before it runs the answer's tools.
    """

    def __init__(self, forwarder: Forwarder, then: RunHooks[Any] | None = None) -> None:
        """Pace `forwarder`'s rounds; `then` (the tool loop) sees each round after."""
        self._forwarder = forwarder
        self._then = then
        self._rounds = 0

    async def on_llm_end(self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse) -> None:
        """The round's events forwarded first, then the tool loop's count."""
        self._rounds += 1
        await self._forwarder.caught_up(self._rounds)
        if self._then is not None:
            await self._then.on_llm_end(context, agent, response)
