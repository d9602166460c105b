"""The chat-completions model of a run, with tool call ids made distinct across its turns.

The SDK takes a tool call id for the identity of a call within the whole conversation: a later
turn's call with an id an earlier turn used counts as already answered, so it is neither run
nor sent back to the model (the next request repeats the last one). OpenAI never reuses an id,
but an OpenAI-compatible server may number its calls per answer (`call_0`, `call_1`, ...), and
the platform's scripted model does. Such a call is renamed (`call_0-2`) before the SDK sees it,
in every event that names it, so it runs and the model reads its result under the new id.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from agents import OpenAIChatCompletionsModel
from agents.items import TResponseStreamEvent
from openai import AsyncOpenAI
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
)


class ChatModel(OpenAIChatCompletionsModel):
    """`OpenAIChatCompletionsModel` for one run: a tool call id an earlier turn used is renamed."""

    def __init__(self, model: str, openai_client: AsyncOpenAI) -> None:
        """`model` at `openai_client`'s base URL; one instance serves one run."""
        super().__init__(model=model, openai_client=openai_client)
        self._used: set[str] = set()

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        """The parent's events, with the call ids of this turn distinct from every earlier turn's."""
        renamed: dict[str, str] = {}
        async for event in super().stream_response(*args, **kwargs):
            yield self._distinct(event, renamed)
        self._used.update(renamed.values())

    def _distinct(self, event: TResponseStreamEvent, renamed: dict[str, str]) -> TResponseStreamEvent:
        if isinstance(event, ResponseOutputItemAddedEvent | ResponseOutputItemDoneEvent):
            if isinstance(event.item, ResponseFunctionToolCall):
                return event.model_copy(update={"item": self._call(event.item, renamed)})
        elif isinstance(event, ResponseCompletedEvent):
            output = [
                self._call(i, renamed) if isinstance(i, ResponseFunctionToolCall) else i for i in event.response.output
            ]
            return event.model_copy(update={"response": event.response.model_copy(update={"output": output})})
        return event

    def _call(self, call: ResponseFunctionToolCall, renamed: dict[str, str]) -> ResponseFunctionToolCall:
        if call.call_id not in renamed:
            renamed[call.call_id] = self._fresh(call.call_id)
        call_id = renamed[call.call_id]
        return call if call_id == call.call_id else call.model_copy(update={"call_id": call_id})

    def _fresh(self, call_id: str) -> str:
        """`call_id`, or the first `call_id-<n>` no earlier turn used."""
        fresh, n = call_id, 1
        while fresh in self._used:
            n += 1
            fresh = f"{call_id}-{n}"
        return fresh
