"""A run's conversation in Cohere's v2 chat terms, and the tools as Cohere declares them.

Cohere's shape is close to OpenAI's chat: the system prompt is the first message (`system`),
then `user` and `assistant` messages with string content. A round that calls tools is an
assistant message with `tool_calls` (`{"id", "type": "function", "function": {"name",
"arguments"}}`, the arguments a JSON string) and its `tool_plan` (the text the model streamed
before its calls), followed by one `tool` message per call (`tool_call_id`, `content`). History
turns map as follows: `system` ones (a compaction summary) join the system prompt, `tool` ones
(kept without their call) are user text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from atmosphere.runtimes.cohere._stream import RoundResult, ToolCall
from atmosphere.sdk import AiRequest
from atmosphere.sdk.runtime import ToolSpec

NO_TOOLS = "NONE"
"""`tool_choice` of a round that must answer without tools: the tools stay declared (the
conversation holds calls of them) but the model may not call them."""


@dataclass
class Exchange:
    """The conversation of one run as it grows round by round, and what each request says."""

    request: AiRequest
    instructions: str = ""
    """Appended to the system prompt (structured output's schema, when the native one is not used)."""
    messages: list[dict[str, Any]] = field(default_factory=list)
    """Everything after the system prompt, as sent."""

    def __post_init__(self) -> None:
        if self.messages:
            return
        for turn in self.request.history:
            if turn.role != "system" and turn.content:
                self.messages.append(
                    {"role": "assistant" if turn.role == "assistant" else "user", "content": turn.content}
                )
        self.messages.append({"role": "user", "content": self.request.message})

    def system(self) -> str | None:
        """The system prompt: the agent's, the history's system turns, the instructions."""
        parts = [self.request.system_prompt, *(t.content for t in self.request.history if t.role == "system")]
        text = "\n\n".join(p for p in parts if p)
        text = text + self.instructions if text else self.instructions.strip()
        return text or None

    def wire_messages(self) -> list[dict[str, Any]]:
        """The request's `messages`: the system prompt first (when there is one), then the conversation."""
        system = self.system()
        head = [{"role": "system", "content": system}] if system is not None else []
        return [*head, *(dict(m) for m in self.messages)]

    def add_round(self, result: RoundResult, results: list[str]) -> None:
        """The assistant's round with its tool calls, then their results (one per call, in order)."""
        assistant: dict[str, Any] = {"role": "assistant", "tool_calls": [tool_call(c) for c in result.tool_calls]}
        if result.text.strip():
            assistant["tool_plan"] = result.text
        self.messages.append(assistant)
        self.messages += [
            {"role": "tool", "tool_call_id": c.call_id, "content": text}
            for c, text in zip(result.tool_calls, results, strict=True)
        ]

    def add_retry(self, answer: str, reprompt: str) -> None:
        """An answer that did not validate, then the user's request to fix it."""
        if answer.strip():
            self.messages.append({"role": "assistant", "content": answer})
        self.messages.append({"role": "user", "content": reprompt})


def tools(specs: tuple[ToolSpec, ...]) -> list[dict[str, Any]]:
    """The tools as Cohere declares them (`{"type": "function", "function": {...}}`)."""
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in specs
    ]


def tool_call(call: ToolCall) -> dict[str, Any]:
    """A call as the assistant's message repeats it.

    Its arguments are a JSON object's text: `{}` when the model's were none, which Cohere would
    refuse in the conversation.
    """
    return {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": arguments_json(call)}}


def arguments_json(call: ToolCall) -> str:
    """The model's arguments when they are a JSON object, else `{}`."""
    try:
        value = json.loads(call.arguments or "{}")
    except ValueError:
        return "{}"
    return call.arguments if isinstance(value, dict) else "{}"
