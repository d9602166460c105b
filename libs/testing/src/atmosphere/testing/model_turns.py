"""What the scripted model answers (`Turn`) and what it was asked (`ModelRequest`).

These types are wire-neutral: a `Turn` says what the model does — text, tool calls, an HTTP
error, a stall, a cut or broken stream — and each wire's encoder (`atmosphere.testing.openai_wire`,
`atmosphere.testing.anthropic_wire`) spells it in that provider's format, so one script serves
every wire the fake speaks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from atmosphere.sdk.errors import UserError

Shape = Literal["answer", "stream_error", "raw", "empty", "malformed", "comments"]
"""How a 200 stream goes: a normal answer, or one of the broken streams tests provoke."""
DEFAULT_USAGE = (10, 5)
"""What a turn that finishes normally reports, as a real provider would: (input, output) tokens."""


@dataclass(frozen=True)
class ToolCallScript:
    """One tool call the scripted model asks for."""

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    """The arguments object, or raw JSON text (to test what a model's malformed JSON does)."""
    call_id: str = ""
    """Empty: `call_<n>` is assigned."""

    @property
    def arguments_json(self) -> str:
        """The arguments as the model sends them."""
        return self.arguments if isinstance(self.arguments, str) else json.dumps(dict(self.arguments))


@dataclass(frozen=True, slots=True)
class Turn:
    """What the model answers to one request; build one with the class methods.

    A turn that finishes normally reports `usage` (default (10, 5)); pass `usage=None` for a
    stream without a usage report. The broken shapes (`truncated`, `malformed`, `empty`, `raw`,
    `stream_error`, `comments_only`) and errors report none: their stream never gets that far.
    """

    content: str = ""
    """The answer text (streamed word by word unless `chunks` says otherwise)."""
    calls: tuple[ToolCallScript, ...] = ()
    """The tool calls asked for."""
    status: int = 200
    """Not 200: the provider fails the request with this HTTP status and `error_message`."""
    error_message: str = ""
    usage: tuple[int, int] | None = DEFAULT_USAGE
    """(input, output) tokens reported for the round; None reports none. On Anthropic's wire the
    input excludes the prompt-cache tokens below, as Anthropic counts them."""
    cache_read_tokens: int = 0
    """Input tokens read from the provider's prompt cache (Anthropic's `cache_read_input_tokens`;
    only the Anthropic wire reports them)."""
    cache_creation_tokens: int = 0
    """Input tokens written to the provider's prompt cache (Anthropic's `cache_creation_input_tokens`;
    only the Anthropic wire reports them)."""
    finish_reason: str = ""
    """Default: `tool_calls` when there are calls, else `stop`; `length` cuts the answer short.
    Named in OpenAI's words; another wire's encoder says the same in its own (Anthropic's:
    `end_turn`, `tool_use`, `max_tokens`, `refusal` for `content_filter`; any other word is sent
    as it is, e.g. `pause_turn`)."""
    shape: Shape = "answer"
    chunks: tuple[str, ...] = ()
    """The pieces `content` streams in (empty: its words); for `raw`, the exact payloads."""
    chunk_delay: float = 0.0
    """Seconds before each piece of the stream."""
    stall: float = 0.0
    """Seconds of silence after the text, before the tool calls and the finish."""
    silence: float = 0.0
    """Seconds of saying nothing at all (not even headers) before answering."""
    comment_every: float = 0.0
    """For `comments`: a keep-alive comment every this many seconds, and never an answer."""
    finish: bool = True
    """False: the stream ends after the pieces, with neither a finish reason nor its end marker."""
    split_arguments: int = 8
    """Tool-call arguments stream in pieces of this many characters."""
    timestamps: bool = False
    """Replace each text piece by its send time in ns plus a space (for latency benches)."""
    retry_after: str | None = None
    """An error's `Retry-After` header."""
    error_code: str | None = None
    error_type: str = "scripted"
    error_param: str | None = None

    @property
    def failed(self) -> bool:
        """The request fails with an HTTP error (`status`) rather than a 200 stream."""
        return self.status != 200

    @property
    def pieces(self) -> tuple[str, ...]:
        """The text pieces to stream, in order."""
        if self.chunks:
            return self.chunks
        return tuple(_words(self.content)) if self.content else ()

    @classmethod
    def text(
        cls,
        text: str,
        *,
        usage: tuple[int, int] | None = DEFAULT_USAGE,
        finish_reason: str = "",
        chunk_delay: float = 0.0,
        words: bool = True,
        timestamps: bool = False,
        cache_read_tokens: int = 0,
        cache_creation_tokens: int = 0,
    ) -> Turn:
        """Answer with `text`, streamed word by word (or character by character), then `finish_reason`.

        `cache_read_tokens` and `cache_creation_tokens` are the prompt-cache tokens the round
        reports besides `usage` (on Anthropic's wire).
        """
        pieces = _words(text) if words else list(text)
        return cls(
            content=text,
            usage=usage,
            finish_reason=finish_reason,
            chunks=tuple(pieces),
            chunk_delay=chunk_delay,
            timestamps=timestamps,
            cache_read_tokens=cache_read_tokens,
            cache_creation_tokens=cache_creation_tokens,
        )

    @classmethod
    def tool_call(cls, name: str, /, **arguments: Any) -> Turn:
        """Ask for one call of tool `name` with `arguments`."""
        return cls(calls=(ToolCallScript(name, arguments),))

    @classmethod
    def tool_calls(cls, *calls: ToolCallScript, text: str = "", usage: tuple[int, int] | None = DEFAULT_USAGE) -> Turn:
        """Ask for several tool calls at once (they run concurrently), optionally after some text."""
        return cls(content=text, calls=tuple(calls), usage=usage)

    @classmethod
    def structured(cls, value: BaseModel | Mapping[str, Any]) -> Turn:
        """Answer with `value` as JSON: the structured output of an agent with `response_format`."""
        text = value.model_dump_json() if isinstance(value, BaseModel) else json.dumps(dict(value))
        return cls(content=text)

    @classmethod
    def error(
        cls,
        message: str,
        *,
        status: int = 400,
        retry_after: str | float | None = None,
        code: str | None = None,
        error_type: str = "scripted",
        param: str | None = None,
    ) -> Turn:
        """The provider refuses the request with `status` (429 and 5xx are retried per the agent's RetryPolicy).

        `retry_after` becomes the `Retry-After` header; `code`, `error_type` and `param` are the
        error body's fields, as a provider fills them.
        """
        if status < 400:
            msg = f"an error turn needs an HTTP error status (>= 400), got {status}"
            raise UserError(msg)
        return cls(
            status=status,
            error_message=message,
            usage=None,
            retry_after=None if retry_after is None else str(retry_after),
            error_code=code,
            error_type=error_type,
            error_param=param,
        )

    @classmethod
    def stream_error(cls, *, message: str, code: str | None = None, error_type: str = "server_error") -> Turn:
        """A 200 stream whose only event is an error (llama.cpp's way of refusing mid-stream)."""
        return cls(shape="stream_error", error_message=message, error_code=code, error_type=error_type, usage=None)

    @classmethod
    def raw(cls, *payloads: str) -> Turn:
        """A 200 stream of exactly these payloads, then the end marker (for hostile chunks)."""
        return cls(shape="raw", chunks=payloads, usage=None)

    @classmethod
    def empty(cls) -> Turn:
        """A 200 stream with nothing but its end marker: no text, no tool call, no finish reason."""
        return cls(shape="empty", usage=None)

    @classmethod
    def silent(cls, seconds: float, *, usage: tuple[int, int] | None = DEFAULT_USAGE) -> Turn:
        """Accept the request, then send no byte (not even headers) for `seconds`, then `ok`."""
        return cls(content="ok", chunks=("ok",), silence=seconds, usage=usage)

    @classmethod
    def comments_only(cls, every: float) -> Turn:
        """Headers, then only keep-alive comments every `every` seconds, never an answer."""
        return cls(shape="comments", comment_every=every, usage=None)

    @classmethod
    def truncated(cls, text: str) -> Turn:
        """Stream `text`, then end the stream with neither a finish reason nor the end marker."""
        return cls(content=text, chunks=tuple(_words(text)), finish=False, usage=None)

    @classmethod
    def stalled(cls, text: str, *, seconds: float, usage: tuple[int, int] | None = DEFAULT_USAGE) -> Turn:
        """Stream `text`, then send nothing for `seconds` before finishing."""
        return cls(content=text, chunks=tuple(_words(text)), stall=seconds, usage=usage)

    @classmethod
    def malformed(cls, text: str = "") -> Turn:
        """Stream `text`, then a chunk that is not JSON."""
        return cls(shape="malformed", content=text, usage=None)


def block_text(content: Any) -> str:
    """The text of an Anthropic `content`: a string, or the joined text of its `text` blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, Mapping) and b.get("type") == "text")
    return "" if content is None else str(content)


def _words(text: str) -> list[str]:
    """`text` in the pieces a model streams: each word with the space after it."""
    split = text.split(" ")
    last = len(split) - 1
    return [w if i == last else w + " " for i, w in enumerate(split) if w or i == last]


@dataclass(frozen=True, slots=True, eq=False)
class ModelRequest(Mapping[str, Any]):
    """One request the model got, as a script function sees it and as `ScriptedModel.requests` keeps it.

    Also a read-only mapping over the request body (`request["messages"]`, `"tools" in request`),
    so a test reads a request the same whichever way the model was reached.
    """

    messages: tuple[Mapping[str, Any], ...]
    """The conversation as the wire sent it (OpenAI's: system, history, user, tool calls and results;
    Anthropic's: history, user, `tool_use` and `tool_result` blocks, the system prompt apart)."""
    tools: tuple[str, ...]
    """The names of the tools offered (user tools and the harness's built-in ones)."""
    body: Mapping[str, Any]
    """The whole request body (model, response_format, stream options, ...)."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """The request's HTTP headers, names in lower case."""

    @property
    def last_tool_result(self) -> str | None:
        """The content of the newest tool result, or None.

        OpenAI's and Cohere's `tool` message, Anthropic's `tool_result` block, Gemini's
        `functionResponse` part (its `result`).
        """
        for message in reversed(self.messages):
            if message.get("role") == "tool":
                return block_text(message.get("content"))
            content = message.get("content")
            if isinstance(content, list):
                results = [b for b in content if isinstance(b, Mapping) and b.get("type") == "tool_result"]
                if results:
                    return block_text(results[-1].get("content"))
            responses = [p["functionResponse"] for p in message.get("parts") or () if "functionResponse" in p]
            if responses:
                response = responses[-1].get("response") or {}
                result = response.get("result") if isinstance(response, Mapping) else None
                return result if isinstance(result, str) else json.dumps(response)
        return None

    @property
    def prompt(self) -> str:
        """The text of the first user message, whichever wire (Gemini's: its `text` parts)."""
        first = next((m for m in self.messages if m.get("role") == "user"), {})
        if "parts" in first:
            return "".join(str(p.get("text", "")) for p in first["parts"] if isinstance(p, Mapping))
        return block_text(first.get("content"))

    def __getitem__(self, key: str) -> Any:
        """The body's field `key`, as sent (a list stays a list)."""
        return self.body[key]

    def __iter__(self) -> Iterator[str]:
        """The body's field names."""
        return iter(self.body)

    def __len__(self) -> int:
        """How many fields the body has."""
        return len(self.body)
