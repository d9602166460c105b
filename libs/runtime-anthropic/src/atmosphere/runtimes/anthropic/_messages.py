"""A run's conversation in the Messages API's terms, and the body of each round's request.

Anthropic's shape differs from OpenAI's chat: the system prompt is a top-level `system`, not a
message; `messages` alternate `user` and `assistant`; a tool call is a `tool_use` block of the
assistant's message and its result a `tool_result` block of the next user message. History turns
map as follows: `system` ones (a compaction summary) join the system prompt, `tool` ones (kept
without their call) are user text, and consecutive turns of one role merge into one message.

Prompt caching: when the request's `CacheHint` asks (and `LLM_PROMPT_CACHE_KEY` is not
`disabled`), `cache_control: {"type": "ephemeral"}` marks the end of the shared prefix: the last
tool and the system prompt (`conservative`), and the newest message too (`aggressive`, whose
whole growing conversation is the prefix) — three of Anthropic's four breakpoints. Anthropic has
no cache key: the hint's key is not sent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from atmosphere.runtimes.anthropic._stream import RoundResult, ToolUse
from atmosphere.sdk import AiRequest, PromptCache
from atmosphere.sdk.runtime import ToolSpec

EPHEMERAL = {"type": "ephemeral"}
NO_TOOLS = {"type": "none"}
"""`tool_choice` of a round that must answer without tools: the tools stay defined, as Anthropic
requires of a conversation holding `tool_use` blocks, but the model may not call them."""


@dataclass(frozen=True, slots=True)
class CacheMarks:
    """Which parts of a request carry a `cache_control` breakpoint."""

    prefix: bool = False
    """The last tool and the system prompt."""
    conversation: bool = False
    """The newest message too."""

    @classmethod
    def of(cls, request: AiRequest, mode: str) -> CacheMarks:
        """The marks `request`'s hint asks for; none when `mode` (`LLM_PROMPT_CACHE_KEY`) is `disabled`."""
        hint = request.cache_hint
        if hint is None or hint.policy is PromptCache.NONE or mode.strip().lower() == "disabled":
            return cls()
        return cls(prefix=True, conversation=hint.policy is PromptCache.AGGRESSIVE)


@dataclass
class Exchange:
    """The conversation of one run as it grows round by round, and what each request says."""

    request: AiRequest
    marks: CacheMarks = field(default_factory=CacheMarks)
    instructions: str = ""
    """Appended to the system prompt (structured output's schema, when the native one is refused)."""
    messages: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.messages:
            return
        for turn in self.request.history:
            if turn.role != "system" and turn.content:
                self._add("assistant" if turn.role == "assistant" else "user", [_text(turn.content)])
        self._add("user", [_text(self.request.message)])

    def system(self) -> str | list[dict[str, Any]] | None:
        """The `system` of the request: the system prompt, the history's system turns, the instructions."""
        parts = [self.request.system_prompt, *(t.content for t in self.request.history if t.role == "system")]
        text = "\n\n".join(p for p in parts if p)
        text = text + self.instructions if text else self.instructions.strip()
        if not text:
            return None
        if self.marks.prefix:
            return [{"type": "text", "text": text, "cache_control": EPHEMERAL}]
        return text

    def wire_messages(self) -> list[dict[str, Any]]:
        """The `messages` of the request (a plain message's content is a string, as most clients send it)."""
        messages = [{"role": m["role"], "content": _plain(m["content"])} for m in self.messages]
        if self.marks.conversation and messages:
            last = self.messages[-1]
            blocks = [dict(b) for b in last["content"]]
            blocks[-1]["cache_control"] = EPHEMERAL
            messages[-1] = {"role": last["role"], "content": blocks}
        return messages

    def add_round(self, result: RoundResult, results: list[str]) -> None:
        """The assistant's round with its tool calls, then their results (one per call, in order)."""
        blocks = [_text(result.text)] if result.text.strip() else []
        blocks += [
            {"type": "tool_use", "id": c.call_id, "name": c.name, "input": tool_input(c)} for c in result.tool_calls
        ]
        self._add("assistant", blocks)
        self._add("user", [tool_result(c.call_id, text) for c, text in zip(result.tool_calls, results, strict=True)])

    def add_retry(self, answer: str, reprompt: str) -> None:
        """An answer that did not validate, then the user's request to fix it."""
        if answer.strip():
            self._add("assistant", [_text(answer)])
        self._add("user", [_text(reprompt)])

    def _add(self, role: str, blocks: list[dict[str, Any]]) -> None:
        """Append a message, or merge into the last one of the same role (the roles must alternate)."""
        if self.messages and self.messages[-1]["role"] == role:
            self.messages[-1]["content"].extend(blocks)
        else:
            self.messages.append({"role": role, "content": list(blocks)})


def tools(specs: tuple[ToolSpec, ...], marks: CacheMarks) -> list[dict[str, Any]]:
    """The tools as Anthropic declares them (the last one marked for caching when asked)."""
    declared: list[dict[str, Any]] = [
        {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in specs
    ]
    if marks.prefix and declared:
        declared[-1]["cache_control"] = EPHEMERAL
    return declared


def tool_input(call: ToolUse) -> dict[str, Any]:
    """A call's input as the assistant's `tool_use` block repeats it: an object (`{}` if the model's JSON was none)."""
    try:
        value = json.loads(call.arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def tool_result(call_id: str, text: str) -> dict[str, Any]:
    """A `tool_result` block; `is_error` when the choke point reports a failed call (`Error: ...`)."""
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id, "content": text}
    if text.startswith("Error:"):
        block["is_error"] = True
    return block


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _plain(blocks: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """One text block as a plain string; anything else as its blocks (copied: the request may be marked)."""
    if len(blocks) == 1 and blocks[0].get("type") == "text" and set(blocks[0]) == {"type", "text"}:
        return str(blocks[0]["text"])
    return [dict(b) for b in blocks]
