"""One streamed round read from Cohere's chat events: text, the tool plan, tool calls, the finish, usage.

Everything the provider sends is untrusted: the SDK builds its event objects without validating
them (`UncheckedBaseModel`), so a field may be missing or of another type; counts are clamped
and the round's size is bounded. Events are told apart by their `type`, as the SDK does.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from atmosphere.runtimes.cohere._errors import PROVIDER_TOO_LARGE
from atmosphere.sdk import TokenUsage
from atmosphere.sdk.runtime_errors import RunFailedError

MAX_ROUND_CHARS = 8 << 20
"""Text plus tool-call arguments of one round held in memory; more is refused, not buffered."""
MAX_CALLS = 256
"""Tool calls one round may have; a call of a larger index is ignored."""
CUT_OFF = {"MAX_TOKENS": "length"}
"""Cohere's finish reasons of an answer cut short, as the platform's (`Complete.finish_reason`).
Cohere has no finish reason for a content filter."""
FINISHED = frozenset({"COMPLETE", "STOP_SEQUENCE", "TOOL_CALL"})
"""Cohere's finish reasons of an answer that ended as the model meant it to."""
FAILED = frozenset({"ERROR", "TIMEOUT"})
"""Cohere's finish reasons of a generation that failed (`message-end` says why in `error`)."""


@dataclass
class ToolCall:
    """A tool call being assembled from its `tool-call-delta` fragments."""

    call_id: str
    name: str
    fragments: list[str] = field(default_factory=list, repr=False)
    arguments: str = ""
    """The arguments' JSON text as the model sent it (set when the round ends)."""


@dataclass
class RoundResult:
    """What one model round produced."""

    text: str = ""
    """Everything the round said, in order: its answer, or the tool plan of a round that calls tools."""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    """Cohere's own word (`COMPLETE`, `TOOL_CALL`, `MAX_TOKENS`, ...); None when its stream ended without one."""
    usage: TokenUsage | None = None
    error: str = ""
    """Why the generation failed (`message-end`'s `error`), for `ERROR` and `TIMEOUT`."""

    @property
    def cut_off(self) -> bool:
        """Whether the provider stopped the answer short (the token limit)."""
        return self.finish_reason in CUT_OFF


@dataclass(frozen=True)
class RoundHooks:
    """Where a round's pieces go as they arrive."""

    on_text: Callable[[str], Awaitable[None]]
    on_tool_delta: Callable[[str, str, str], Awaitable[None]]
    """(call id, tool name, arguments fragment)."""
    on_retry: Callable[[str], Awaitable[None]] | None = None
    """A status line before each retry: what failed, when the next attempt starts."""


class RoundState:
    """One attempt's reading of the stream."""

    def __init__(self, hooks: RoundHooks) -> None:
        """Read into `hooks`."""
        self.hooks = hooks
        self.forwarded = False
        """Part of the answer reached the client: no retry any more."""
        self.answering = False
        """The provider sent its first event."""
        self.ended = False
        """`message-end` arrived: the stream ended properly."""
        self.finish_reason: str | None = None
        self.error = ""
        self.text: list[str] = []
        self.calls: dict[int, ToolCall] = {}
        self.chars = 0
        self.counts: dict[str, int] = {}

    async def consume(self, event: Any) -> None:
        """Take one event of the stream."""
        self.answering = True
        kind = getattr(event, "type", None)
        message = getattr(getattr(event, "delta", None), "message", None)
        if kind == "content-delta":
            await self._text(getattr(getattr(message, "content", None), "text", None))
        elif kind == "tool-plan-delta":
            await self._text(getattr(message, "tool_plan", None))
        elif kind == "tool-call-start":
            self._call(getattr(event, "index", None), getattr(message, "tool_calls", None))
        elif kind == "tool-call-delta":
            function = getattr(getattr(message, "tool_calls", None), "function", None)
            await self._fragment(getattr(event, "index", None), getattr(function, "arguments", None))
        elif kind == "message-end":
            self._end(getattr(event, "delta", None))

    async def _text(self, text: Any) -> None:
        if not isinstance(text, str) or not text:
            return
        self._grow(len(text))
        text = replace_lone_surrogates(text)
        self.text.append(text)
        self.forwarded = True
        await self.hooks.on_text(text)

    def _call(self, index: Any, head: Any) -> None:
        if not isinstance(index, int) or not 0 <= index < MAX_CALLS:
            return
        call_id, name = getattr(head, "id", None), getattr(getattr(head, "function", None), "name", None)
        self.calls[index] = ToolCall(
            # A call without an id still needs one: its deltas, its run and its result name it.
            call_id=call_id[:200] if isinstance(call_id, str) and call_id else f"call_{index}",
            name=name[:200] if isinstance(name, str) else "",
        )

    async def _fragment(self, index: Any, fragment: Any) -> None:
        call = self.calls.get(index) if isinstance(index, int) else None
        if call is None or not isinstance(fragment, str) or not fragment:
            return
        self._grow(len(fragment))
        fragment = replace_lone_surrogates(fragment)
        call.fragments.append(fragment)
        self.forwarded = True
        await self.hooks.on_tool_delta(call.call_id, call.name, fragment)

    def _end(self, delta: Any) -> None:
        self.ended = True
        reason = getattr(delta, "finish_reason", None)
        if isinstance(reason, str) and reason:
            self.finish_reason = reason[:64]
        error = getattr(delta, "error", None)
        if isinstance(error, str):
            self.error = replace_lone_surrogates(error[:500]).strip()
        usage = getattr(delta, "usage", None)
        # `tokens` are what the model read and wrote; `billed_units` leave out what Cohere does not
        # charge (its own prompt template), so they are only the fallback.
        for source in (getattr(usage, "billed_units", None), getattr(usage, "tokens", None)):
            for name in ("input_tokens", "output_tokens"):
                value = getattr(source, name, None)
                if value is not None:
                    self.counts[name] = _number(value)
        cached = getattr(usage, "cached_tokens", None)
        if cached is not None:
            self.counts["cached_tokens"] = _number(cached)

    def _grow(self, size: int) -> None:
        self.chars += size
        if self.chars > MAX_ROUND_CHARS:
            msg = f"the provider's answer exceeded {MAX_ROUND_CHARS} characters in one round"
            raise RunFailedError(PROVIDER_TOO_LARGE, msg)

    def result(self, model: str) -> RoundResult:
        """The round as read so far (`model`: the model asked, as Cohere does not name it in the stream)."""
        calls = [self.calls[i] for i in sorted(self.calls)]
        for call in calls:
            call.arguments = "".join(call.fragments)
        return RoundResult(
            text="".join(self.text),
            tool_calls=calls,
            finish_reason=self.finish_reason,
            usage=self._usage(model),
            error=self.error,
        )

    def _usage(self, model: str) -> TokenUsage | None:
        """Cohere's counts as the platform's: the cache's hits are part of the input."""
        if not self.counts:
            return None
        counts = self.counts
        total_input, output = counts.get("input_tokens", 0), counts.get("output_tokens", 0)
        cached = min(counts.get("cached_tokens", 0), total_input)
        return TokenUsage(
            input=total_input, output=output, cached_input=cached, total=total_input + output, model=model
        )


def _number(value: Any) -> int:
    """A provider's count, untrusted: no negative, non-finite or absurd values."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    if isinstance(value, float) and not math.isfinite(value):
        return 0
    return int(min(max(value, 0), 1 << 53))


def replace_lone_surrogates(text: str) -> str:
    """`text` with each unpaired surrogate (valid in JSON, not in UTF-8) replaced by U+FFFD."""
    if text.isascii():
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
