"""From ADK to the platform: the conversation in, the streamed events and usage out.

What a run's stream shows of ADK's events:

- text: each partial event's text as it streams (`StreamingMode.SSE`), or a final event's
  whole text when its model did not stream;
- a function call the model asked for: one `tool_call_delta` with its whole arguments (Gemini
  sends a call whole, never in fragments);
- usage: one `usage` per model round, from the round's final (non-partial) event;
- a transfer between agents (`transfer_to_agent`): a `handoff` event (from, to, reason
  `transfer_to_agent`); the agent that took over then answers the user, so its text is the
  run's answer, as the root agent's would have been;
- the agent an `AgentTool` runs, which is `delegate_task`'s case (a sub-agent whose answer
  only comes back to the calling model as the tool's result): its events are forwarded tagged
  with `origin_agent` (its name) and `origin_run_id` (`<run id>/<its name>`), as dispatch
  forwards a sub-run's, so they are shown as the sub-agent's and are not the run's answer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from google.adk.events.event import Event
from google.genai import types

from atmosphere.contracts.run.v1.run_pb2 import Handoff, RunEvent, TextDelta, ToolCallDelta
from atmosphere.sdk import ChatMessage, StreamingSession, TokenUsage

TRANSFER_REASON = "transfer_to_agent"


def history_events(history: Sequence[ChatMessage], agent_name: str) -> list[Event]:
    """The platform's history as the session's events: assistant turns as `agent_name`'s, the rest as the user's.

    System messages are left out (the caller folds them into the instructions); a `tool` message
    has no call to answer any more, so it is read as user text.
    """
    events = []
    for message in history:
        if message.role == "system":
            continue
        if message.role == "assistant":
            events.append(Event(author=agent_name, content=types.ModelContent(message.content)))
        else:
            events.append(Event(author="user", content=types.UserContent(message.content)))
    return events


def token_usage(usage: types.GenerateContentResponseUsageMetadata, model: str) -> TokenUsage:
    """Gemini's counts as the platform's: the thinking tokens are output, as Gemini bills them."""
    prompt = usage.prompt_token_count or 0
    output = (usage.candidates_token_count or 0) + (usage.thoughts_token_count or 0)
    return TokenUsage(
        input=prompt,
        output=output,
        cached_input=usage.cached_content_token_count or 0,
        total=usage.total_token_count or prompt + output,
        model=model,
    )


class Forwarder:
    """Forwards one run's ADK events into its session (see the module docstring)."""

    def __init__(self, session: StreamingSession, model: str, tool_names: frozenset[str] | None = None) -> None:
        """Forward into `session`; `tool_names`, when given, are the only calls shown as deltas."""
        self._session = session
        self._model = model
        self._tool_names = tool_names
        self._streamed = False
        """Text of the current model round already went out in partial events."""

    async def forward(self, event: Event) -> None:
        """Take one event of the run."""
        if event.author == "user" or (event.content is None and event.usage_metadata is None and not _transfer(event)):
            return
        parts = (event.content.parts or []) if event.content is not None else []
        if event.partial:
            for text in _texts(parts):
                self._streamed = True
                await self._session.send(text)
            return
        if not self._streamed:
            for text in _texts(parts):
                await self._session.send(text)
        self._streamed = False
        for part in parts:
            call = part.function_call
            if call is not None and call.name and (self._tool_names is None or call.name in self._tool_names):
                delta = ToolCallDelta(call_id=call.id or "", tool_name=call.name, arguments_fragment=_json(call.args))
                await self._session.emit(RunEvent(tool_call_delta=delta))
        if event.usage_metadata is not None:
            await self._session.usage(token_usage(event.usage_metadata, event.model_version or self._model))
        target = _transfer(event)
        if target:
            handoff = Handoff(from_agent=event.author, to_agent=target, reason=TRANSFER_REASON)
            await self._session.emit(RunEvent(handoff=handoff))

    async def forward_delegated(self, event: Event, run_id: str) -> None:
        """Forward an event of an agent run as a tool (`AgentTool`), tagged as that sub-agent's."""
        if event.partial or event.author == "user" or event.content is None:
            return
        origin = f"{run_id}/{event.author}"
        for text in _texts(event.content.parts or []):
            await self._session.emit(
                RunEvent(text_delta=TextDelta(text=text), origin_run_id=origin, origin_agent=event.author)
            )
        for part in event.content.parts or []:
            call = part.function_call
            if call is not None and call.name:
                delta = ToolCallDelta(call_id=call.id or "", tool_name=call.name, arguments_fragment=_json(call.args))
                await self._session.emit(
                    RunEvent(tool_call_delta=delta, origin_run_id=origin, origin_agent=event.author)
                )


def _texts(parts: Sequence[types.Part]) -> list[str]:
    """The answer's text of `parts` (a model's thoughts are not the answer)."""
    return [part.text for part in parts if part.text and not part.thought]


def _transfer(event: Event) -> str:
    return (event.actions.transfer_to_agent or "") if event.actions is not None else ""


def _json(arguments: object) -> str:
    return json.dumps(arguments or {}, ensure_ascii=False)
