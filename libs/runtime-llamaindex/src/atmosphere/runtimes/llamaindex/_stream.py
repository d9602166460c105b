"""From LlamaIndex to the platform: the conversation in; the streamed text, tool-call deltas, usage and handoffs out.

LlamaIndex's agents write their events to the workflow's stream: `AgentInput` as a model turn
begins (naming the agent), an `AgentStream` per chunk of the answer (its text `delta`, and `raw`,
the provider's chunk), then `AgentOutput` with the whole answer. The OpenAI LLM keeps a chunk's
tool-call argument fragments and its token usage only in `raw`, so they are read there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from llama_index.core.agent.workflow import AgentInput, AgentOutput, AgentStream, ToolCall
from llama_index.core.bridge.pydantic import BaseModel
from llama_index.core.llms import ChatMessage as LlamaMessage
from llama_index.core.workflow import Event

from atmosphere.contracts.run.v1.run_pb2 import Handoff, RunEvent, ToolCallDelta
from atmosphere.sdk import ChatMessage, StreamingSession, TokenUsage

HANDOFF_TOOL = "handoff"
"""The name of the tool with which an `AgentWorkflow`'s agent hands the conversation to another."""


def as_chat_history(messages: Sequence[ChatMessage]) -> list[LlamaMessage]:
    """The platform's messages as LlamaIndex's, in order.

    A `tool` message of the history has no call to answer any more, so it is read as user text.
    """
    return [LlamaMessage(role="user" if m.role == "tool" else m.role, content=m.content) for m in messages]


def _as_mapping(raw: object) -> Mapping[str, Any]:
    if isinstance(raw, BaseModel):
        return raw.model_dump()
    return raw if isinstance(raw, Mapping) else {}


def _usage_of(raw: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """Input, output and cached input tokens of a chunk (or answer) that reports them, else None."""
    usage = raw.get("usage")
    if not isinstance(usage, Mapping):
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0), int(cached or 0)


class Forwarder:
    """Sends what the workflow's events add to the answer, as they arrive.

    `streams_text(agent)` says whose answers stream as text: a function-calling agent's text is its
    answer, while a ReAct agent's is its reasoning protocol (`Thought: ... Action: ...`), so only
    its final answer is sent, once known. `tool_names`, when given, are the only tools whose
    argument deltas are forwarded (a handoff is no tool call a client should see).
    """

    def __init__(
        self,
        session: StreamingSession,
        *,
        model_of: Callable[[str], str],
        streams_text: Callable[[str], bool],
        tool_names: frozenset[str] | None = None,
    ) -> None:
        """Forward into `session`; an agent's usage is reported as `model_of(agent)`'s."""
        self._session = session
        self._model_of = model_of
        self._streams_text = streams_text
        self._tool_names = tool_names
        self._speaker: str | None = None
        self._handoff_reason = ""
        self._calls: dict[int, tuple[str, str]] = {}
        """The tool call of each index of the answer streaming now: (call id, tool name)."""
        self._usage_reported = False
        """Whether the answer streaming now reported its usage in a chunk."""
        self.answer_sent = False
        """Whether the text of the latest answer was forwarded (else it is sent once the run ends)."""
        self._answers = 0
        """Model answers (`AgentOutput`s) forwarded to their end."""
        self._forwarded = asyncio.Condition()

    async def caught_up(self, answers: int) -> None:
        """Wait until the first `answers` model answers were forwarded (their text, deltas and usage)."""
        async with self._forwarded:
            await self._forwarded.wait_for(lambda: self._answers >= answers)

    async def forward(self, event: Event) -> None:
        """Send what `event` adds to the answer, if anything."""
        if isinstance(event, AgentStream):
            await self._streamed(event)
        elif isinstance(event, AgentInput):
            await self._turn_begins(event.current_agent_name)
        elif isinstance(event, AgentOutput):
            await self._answered(event)
        elif isinstance(event, ToolCall) and event.tool_name == HANDOFF_TOOL:
            self._handoff_reason = str(event.tool_kwargs.get("reason", ""))

    async def _turn_begins(self, agent: str) -> None:
        """A model turn of `agent` begins: a handoff when another agent spoke before."""
        self._calls = {}
        self.answer_sent = False
        if self._speaker is not None and agent != self._speaker:
            handoff = Handoff(from_agent=self._speaker, to_agent=agent, reason=self._handoff_reason)
            await self._session.emit(RunEvent(handoff=handoff))
        self._speaker = agent
        self._handoff_reason = ""

    async def _streamed(self, event: AgentStream) -> None:
        raw = _as_mapping(event.raw)
        if self._streams_text(event.current_agent_name):
            if event.delta:
                await self._session.send(event.delta)
                self.answer_sent = True
            await self._tool_fragments(raw)
        usage = _usage_of(raw)
        if usage is not None:
            self._usage_reported = True
            await self._report(usage)

    async def _answered(self, event: AgentOutput) -> None:
        """One model answer ended: its usage is reported unless a chunk did (an answer that did not stream)."""
        if not self._usage_reported:
            raw = _as_mapping(event.raw)
            usage = _usage_of(raw)
            if usage is not None:
                await self._report(usage)
        self._usage_reported = False
        async with self._forwarded:
            self._answers += 1
            self._forwarded.notify_all()

    async def _tool_fragments(self, raw: Mapping[str, Any]) -> None:
        """The argument fragments of an OpenAI chunk's tool calls (a call's first names its id and tool)."""
        for choice in raw.get("choices") or ():
            delta = choice.get("delta") or {}
            for call in delta.get("tool_calls") or ():
                index = int(call.get("index") or 0)
                function = call.get("function") or {}
                if call.get("id"):
                    self._calls[index] = (str(call["id"]), str(function.get("name") or ""))
                await self._fragment(index, str(function.get("arguments") or ""))

    async def _fragment(self, index: int, fragment: str) -> None:
        call = self._calls.get(index)
        if not fragment or call is None or (self._tool_names is not None and call[1] not in self._tool_names):
            return
        call_id, name = call
        delta = ToolCallDelta(call_id=call_id, tool_name=name, arguments_fragment=fragment)
        await self._session.emit(RunEvent(tool_call_delta=delta))

    async def _report(self, usage: tuple[int, int, int]) -> None:
        """One model round's tokens (one `usage` a round, as on the built-in runtime), named by the agent's model."""
        input_tokens, output_tokens, cached = usage
        if not input_tokens and not output_tokens:
            return
        tokens = TokenUsage(
            input=input_tokens,
            output=output_tokens,
            cached_input=cached,
            total=input_tokens + output_tokens,
            model=self._model_of(self._speaker or ""),
        )
        await self._session.usage(tokens)
