"""One streamed round read from Anthropic's events: text, `tool_use` blocks, the stop reason, usage.

Everything the provider sends is untrusted: the SDK builds its event objects without validating
them, so a field may be missing or of another type; counts are clamped and the round's size is
bounded.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from anthropic.types import (
    InputJSONDelta,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    RawMessageStopEvent,
    TextDelta,
    ToolUseBlock,
)

from atmosphere.runtimes.anthropic._errors import PROVIDER_TOO_LARGE
from atmosphere.sdk import TokenUsage
from atmosphere.sdk.runtime_errors import RunFailedError

MAX_ROUND_CHARS = 8 << 20
"""Text plus tool-call input of one round held in memory; more is refused, not buffered."""
MAX_BLOCKS = 256
"""Content blocks one round may have; a block of a larger index is ignored."""
CUT_OFF = {"max_tokens": "length", "model_context_window_exceeded": "length", "refusal": "content_filter"}
"""Anthropic's stop reasons of an answer cut short, as the platform's finish reasons
(`Complete.finish_reason`: `length` at the token limit, `content_filter` by the provider)."""


@dataclass
class ToolUse:
    """A `tool_use` block being assembled from its `input_json_delta` fragments."""

    call_id: str
    name: str
    fragments: list[str] = field(default_factory=list, repr=False)
    arguments: str = ""
    """The input's JSON text as the model sent it (set when the round ends)."""


@dataclass
class RoundResult:
    """What one model round produced."""

    text: str = ""
    tool_calls: list[ToolUse] = field(default_factory=list)
    stop_reason: str | None = None
    """Anthropic's own word; None when its stream ended without one."""
    usage: TokenUsage | None = None

    @property
    def cut_off(self) -> bool:
        """Whether the provider stopped the answer short (token limit, context window, refusal)."""
        return self.stop_reason in CUT_OFF


@dataclass(frozen=True)
class RoundHooks:
    """Where a round's pieces go as they arrive."""

    on_text: Callable[[str], Awaitable[None]]
    on_tool_delta: Callable[[str, str, str], Awaitable[None]]
    """(call id, tool name, input fragment)."""
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
        self.stopped = False
        """`message_stop` arrived: the stream ended properly."""
        self.stop_reason: str | None = None
        self.text: list[str] = []
        self.calls: dict[int, ToolUse] = {}
        self.chars = 0
        self.model = ""
        self.counts: dict[str, int] = {}
        """The usage counters as last reported (`message_delta`'s are cumulative: they overwrite)."""

    async def consume(self, event: Any) -> None:
        """Take one event of the stream."""
        self.answering = True
        if isinstance(event, RawContentBlockDeltaEvent):
            await self._delta(event)
        elif isinstance(event, RawContentBlockStartEvent):
            self._block(event)
        elif isinstance(event, RawMessageStartEvent):
            message = getattr(event, "message", None)
            model = getattr(message, "model", None)
            self.model = model[:200] if isinstance(model, str) else ""
            self._count(getattr(message, "usage", None))
        elif isinstance(event, RawMessageDeltaEvent):
            reason = getattr(getattr(event, "delta", None), "stop_reason", None)
            if isinstance(reason, str) and reason:
                self.stop_reason = reason[:64]
            self._count(getattr(event, "usage", None))
        elif isinstance(event, RawMessageStopEvent):
            self.stopped = True

    def _block(self, event: RawContentBlockStartEvent) -> None:
        block = getattr(event, "content_block", None)
        index = getattr(event, "index", None)
        if not isinstance(block, ToolUseBlock) or not isinstance(index, int) or not 0 <= index < MAX_BLOCKS:
            return  # text, thinking and server-side blocks carry nothing to assemble here
        call_id, name = getattr(block, "id", None), getattr(block, "name", None)
        self.calls[index] = ToolUse(
            # A call without an id still needs one: its deltas, its run and its result name it.
            call_id=call_id[:200] if isinstance(call_id, str) and call_id else f"toolu_{index}",
            name=name[:200] if isinstance(name, str) else "",
        )

    async def _delta(self, event: RawContentBlockDeltaEvent) -> None:
        delta = getattr(event, "delta", None)
        if isinstance(delta, TextDelta):
            text = getattr(delta, "text", None)
            if isinstance(text, str) and text:
                self._grow(len(text))
                text = replace_lone_surrogates(text)
                self.text.append(text)
                self.forwarded = True
                await self.hooks.on_text(text)
        elif isinstance(delta, InputJSONDelta):
            call = self.calls.get(getattr(event, "index", -1))
            fragment = getattr(delta, "partial_json", None)
            # Anthropic opens each input with an empty fragment: nothing to forward.
            if call is not None and isinstance(fragment, str) and fragment:
                self._grow(len(fragment))
                fragment = replace_lone_surrogates(fragment)
                call.fragments.append(fragment)
                self.forwarded = True
                await self.hooks.on_tool_delta(call.call_id, call.name, fragment)

    def _grow(self, size: int) -> None:
        self.chars += size
        if self.chars > MAX_ROUND_CHARS:
            msg = f"the provider's answer exceeded {MAX_ROUND_CHARS} characters in one round"
            raise RunFailedError(PROVIDER_TOO_LARGE, msg)

    def _count(self, usage: Any) -> None:
        for name in ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
            value = getattr(usage, name, None)
            if value is not None:
                self.counts[name] = _number(value)

    def result(self) -> RoundResult:
        """The round as read so far."""
        calls = [self.calls[i] for i in sorted(self.calls)]
        for call in calls:
            call.arguments = "".join(call.fragments)
        return RoundResult(text="".join(self.text), tool_calls=calls, stop_reason=self.stop_reason, usage=self._usage())

    def _usage(self) -> TokenUsage | None:
        """Anthropic's counts as the platform's: input is all of it, the cache's reads and writes included.

        `TokenUsage` has `cached_input` (the cache reads) but no field for the cache writes, so
        those are counted in `input` only, as Anthropic bills them as input.
        """
        if not self.counts:
            return None
        counts = self.counts
        cached = counts.get("cache_read_input_tokens", 0)
        total_input = counts.get("input_tokens", 0) + counts.get("cache_creation_input_tokens", 0) + cached
        output = counts.get("output_tokens", 0)
        return TokenUsage(
            input=total_input, output=output, cached_input=cached, total=total_input + output, model=self.model
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
