"""One model round against an OpenAI-compatible provider: the HTTP call, deadlines, retries, parsing.

Deadlines of one call (one round):
- each attempt must see the first byte of the answer within `first_byte_timeout` (response
  headers alone do not count: a server that sends them and then nothing is not answering);
- once it answers, no silence may last longer than the client's read timeout (`stall_timeout`);
- the whole call, every attempt and the whole stream included, ends at `call_timeout`, so a
  stream that only sends keep-alive comments cannot hold a run forever;
- a failure before any output is retried only while the call is younger than `retry_window`,
  so a provider that never answers fails within `retry_window + first_byte_timeout`.
While it waits to retry, the caller hears why and when (`RoundHooks.on_retry`).

Everything the provider sends is untrusted: a malformed chunk, an oversized answer, an error
body, text with lone surrogates or absurd numbers become a `ProviderCallError`, never a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from atmosphere.bus.errors import (
    OUT_OF_CREDIT,
    ProviderEmptyAnswerError,
    ProviderError,
    ProviderMalformedError,
    ProviderMisconfiguredError,
    ProviderRateLimitedError,
    ProviderRejectedError,
    ProviderTimeoutError,
    ProviderTooLargeError,
    ProviderUnavailableError,
)
from atmosphere.bus.text import replace_lone_surrogates
from atmosphere.dispatch.errors import CONTEXT_OVERFLOW
from atmosphere.dispatch.runtime.sse import SseError, sse_data
from atmosphere.sdk import RetryPolicy, TokenUsage
from atmosphere.sdk.runtime import RuntimeConfig

log = logging.getLogger("atmosphere.dispatch.runtime")

RETRYABLE_STATUS = frozenset({408, 429})
MAX_ERROR_BODY = 64 * 1024
MAX_PROVIDER_MESSAGE = 500
MAX_TOOL_CALLS = 128
"""Tool calls one round may ask for; a larger index is a malformed stream."""
MAX_ROUND_CHARS = 8 << 20
"""Text plus tool-call arguments of one round held in memory; more is refused, not buffered."""
AFTER_DONE_GRACE = 0.1
"""Seconds the body's end may take after `[DONE]` (read so the connection is kept for the next call)."""
MAX_AFTER_DONE = 16
"""Events read after `[DONE]` at most before the connection is let go instead."""
CUT_OFF_REASONS = frozenset({"length", "content_filter"})
"""Finish reasons of an answer the provider cut short (the token limit, its content filter)."""

_TOKEN = re.compile(r"[A-Za-z0-9_.:\-]{1,64}")


@dataclass(frozen=True, slots=True)
class ProviderFault:
    """What a provider said about an error, each field bounded and safe to forward."""

    message: str
    code: str = ""
    type: str = ""
    param: str = ""


class ProviderCallError(Exception):
    """The provider call failed for good; `error` is the catalogue error the run ends with.

    The message is safe to show to the client. `status` is the provider's HTTP status when it
    answered with one; `provider_code` and `param` are its own error code and parameter (e.g.
    `context_length_exceeded`); `retryable` says whether the same request may succeed later,
    `retry_after` when to try. All of them also travel in `error.details` (ingress maps them to HTTP).
    """

    def __init__(
        self,
        kind: type[ProviderError],
        message: str,
        *,
        status: int | None = None,
        fault: ProviderFault | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        """`kind` is the catalogue class of the failure (`ProviderTimeoutError`, ...)."""
        self.status = status
        self.provider_code = fault.code if fault else ""
        self.param = fault.param if fault else ""
        self.retryable = retryable
        self.retry_after = retry_after
        self.error: ProviderError = kind(message, details=self.details(), retryable=retryable)
        super().__init__(message)

    @property
    def code(self) -> str:
        """The wire code (for logs)."""
        return self.error.code

    def details(self) -> dict[str, str]:
        """The `Error.details` of the run's error terminal."""
        details: dict[str, str] = {}
        if self.status is not None:
            details["status"] = str(self.status)
        if self.provider_code:
            details["provider_code"] = self.provider_code
        if self.param:
            details["provider_param"] = self.param
        if self.retry_after is not None:
            details["retry_after"] = str(math.ceil(self.retry_after))
        return details


@dataclass
class ToolCallBuffer:
    """A tool call being assembled from streamed fragments."""

    call_id: str = ""
    name: str = ""
    arguments: str = ""
    fragments: list[str] = field(default_factory=list, repr=False)
    """The streamed pieces of `arguments`, joined when the round ends."""


@dataclass
class RoundResult:
    """What one streamed model round produced."""

    text: str = ""
    tool_calls: list[ToolCallBuffer] = field(default_factory=list)
    finish_reason: str | None = None
    """Why the provider said the round ended; None when its stream closed (`[DONE]`) without saying."""
    usage: TokenUsage | None = None

    @property
    def cut_off(self) -> bool:
        """Whether the provider stopped the answer short (token limit or content filter)."""
        return self.finish_reason in CUT_OFF_REASONS


@dataclass(frozen=True)
class RoundHooks:
    """Where a round's pieces go as they arrive."""

    on_text: Callable[[str], Awaitable[None]]
    on_tool_delta: Callable[[str, str, str], Awaitable[None]]
    """(call id, tool name, arguments fragment)."""
    on_retry: Callable[[str], Awaitable[None]] | None = None
    """A status line before each retry: what failed, when the next attempt starts."""


@dataclass(frozen=True, slots=True)
class CallLimits:
    """The deadlines of one model call (see the module docstring)."""

    first_byte_timeout: float = 10.0
    call_timeout: float = 300.0
    retry_window: float = 20.0
    stall_timeout: float = 30.0
    """Enforced by the HTTP client's read timeout; here for the messages."""

    @classmethod
    def of(cls, config: RuntimeConfig) -> CallLimits:
        """The limits configured for a runtime."""
        return cls(config.first_byte_timeout, config.call_timeout, config.retry_window, config.stall_timeout)


def retry_after_seconds(value: str | None) -> float | None:
    """`Retry-After` as seconds: either a number or an HTTP date."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, moment.timestamp() - time.time())


def _token(value: Any) -> str:
    """An identifier-like field of a provider error (code, type, param), or "" when it is not one."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    return value if isinstance(value, str) and _TOKEN.fullmatch(value) else ""


def _bounded(text: str, limit: int = MAX_PROVIDER_MESSAGE) -> str:
    return replace_lone_surrogates(text[:limit]).strip()


def provider_fault(raw: bytes | str) -> ProviderFault:
    """The provider's own account of an error body (OpenAI's `{"error": {...}}` shape or looser)."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        return ProviderFault(_bounded(text, 300) or "no details")
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            message = error.get("message")
            return ProviderFault(
                _bounded(message) if isinstance(message, str) and message.strip() else "no details",
                code=_token(error.get("code")),
                type=_token(error.get("type")),
                param=_token(error.get("param")),
            )
        if isinstance(error, str):
            return ProviderFault(_bounded(error) or "no details")
        if isinstance(body.get("message"), str):
            return ProviderFault(_bounded(body["message"]) or "no details")
    return ProviderFault(_bounded(text, 300) or "no details")


def _retryable(status: int) -> bool:
    return status in RETRYABLE_STATUS or 500 <= status <= 599


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s".replace(".0 s", " s")


class _RetryableError(Exception):
    """An attempt failed in a way another attempt may not (nothing of it reached the client yet)."""

    def __init__(
        self,
        reason: str,
        description: str,
        *,
        kind: type[ProviderError] = ProviderUnavailableError,
        status: int | None = None,
        fault: ProviderFault | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.reason = reason
        """Short, for the progress line: "Model provider did not answer (timeout)"."""
        self.description = description
        """Precise, for the final error: "API returned 503: overloaded"."""
        self.kind = kind
        """The catalogue class of the failure should no retry be left."""
        self.status = status
        self.fault = fault
        self.retry_after = retry_after
        super().__init__(description)

    def final(self, attempts: int) -> ProviderCallError:
        """The error that ends the call after `attempts` attempts."""
        message = self.description if attempts == 1 else f"Failed after {attempts} attempts: {self.description}"
        return ProviderCallError(
            self.kind,
            message,
            status=self.status,
            fault=self.fault,
            retryable=True,
            retry_after=self.retry_after,
        )


async def stream_round(
    client: httpx.AsyncClient,
    *,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    retry: RetryPolicy,
    hooks: RoundHooks,
    limits: CallLimits | None = None,
) -> RoundResult:
    """Run one streamed round, retrying only while nothing of it has reached the client.

    Retried (within the retry window): connection failures, no answer in time, 408, 429, 5xx,
    a stream that broke before any output. Never retried: other statuses, and any failure after
    text or a tool-call fragment was forwarded (the client already saw part of the answer).
    """
    limits = limits or CallLimits()
    loop = asyncio.get_running_loop()
    started = loop.time()
    call = _Call(url, body, headers, limits, deadline=started + limits.call_timeout)
    attempts = retry.max_retries + 1
    for attempt in range(1, attempts + 1):
        state = _RoundState(hooks)
        try:
            return await _attempt(client, call, state)
        except _RetryableError as failure:
            if state.forwarded:
                raise failure.final(1) from None
            delay = retry.delay(attempt - 1, retry_after=failure.retry_after)
            now = loop.time()
            in_window = now - started + delay <= limits.retry_window and now + delay < call.deadline
            if attempt == attempts or not in_window:
                raise failure.final(attempt) from None
            log.info(
                "provider call failed (%s); retry %d/%d in %.2fs", failure.description, attempt, attempts - 1, delay
            )
            if hooks.on_retry is not None:
                await hooks.on_retry(
                    f"{failure.reason}; retrying in {_seconds(delay)} (attempt {attempt + 1} of {attempts})"
                )
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


@dataclass(frozen=True, slots=True)
class _Call:
    url: str
    body: dict[str, Any]
    headers: dict[str, str]
    limits: CallLimits
    deadline: float
    """`loop.time()` at which the whole call ends."""


class _RoundState:
    def __init__(self, hooks: RoundHooks) -> None:
        self.hooks = hooks
        self.result = RoundResult()
        self.forwarded = False
        """Part of the answer reached the client: no retry any more."""
        self.answering = False
        """The provider sent the first byte of its answer."""
        self.calls: dict[int, ToolCallBuffer] = {}
        self.text: list[str] = []
        """The round's text pieces (joined once at the end: `+=` on an attribute is quadratic)."""
        self.chars = 0
        self.done = False


async def _attempt(client: httpx.AsyncClient, call: _Call, state: _RoundState) -> RoundResult:
    loop = asyncio.get_running_loop()
    first_byte_by = min(loop.time() + call.limits.first_byte_timeout, call.deadline)
    timer = asyncio.timeout_at(first_byte_by)
    try:
        async with timer, client.stream("POST", call.url, json=call.body, headers=call.headers) as response:
            if response.status_code != 200:
                raise await _status_failure(response)
            await _read_answer(response, timer, call.deadline, state)
    except TimeoutError:
        if not timer.expired():
            raise  # not ours: e.g. a bus timeout in a hook
        if state.done:
            return _finish(state)  # the deadline fell while the body's end was read: the answer is whole
        if state.answering or first_byte_by >= call.deadline:
            msg = f"the model call exceeded its {call.limits.call_timeout:g} s deadline"
            raise ProviderCallError(ProviderTimeoutError, msg, retryable=True) from None
        raise _no_answer(call.limits.first_byte_timeout) from None
    except httpx.TimeoutException as exc:
        raise _timeout(exc, state, call.limits) from None
    except httpx.DecodingError:
        raise ProviderCallError(ProviderMalformedError, "the provider sent an undecodable body") from None
    except httpx.UnsupportedProtocol:
        # A configuration error (LLM_BASE_URL): no retry can fix it.
        msg = f"the model provider URL {call.url!r} is not http(s)"
        raise ProviderCallError(ProviderMisconfiguredError, msg) from None
    except httpx.RequestError as exc:
        description = f"provider connection failed ({_connection_failure(exc)})"
        raise _RetryableError("Model provider unreachable (connection failed)", description) from None
    except SseError as exc:
        raise ProviderCallError(ProviderMalformedError, str(exc)) from None
    return _finish(state)


async def _read_answer(response: httpx.Response, timer: asyncio.Timeout, deadline: float, state: _RoundState) -> None:
    """Consume the answer's events until `[DONE]` (then read the body's end) or the body ends."""
    events = sse_data(_answer_lines(response, timer, deadline, state))
    async for data in events:
        if data.strip() == "[DONE]":
            state.done = True
            await _read_to_end(events)
            return
        await _consume(data, state)


async def _read_to_end(events: AsyncIterator[str]) -> None:
    """Read what follows `[DONE]` (in practice the body's last chunk), briefly and within bounds.

    An HTTP/1.1 connection whose response was not read to its end cannot carry the next one:
    left unread, every model call opened a connection of its own (a TLS handshake, against a
    real provider). A provider that sends more, or ends late, only costs its connection.
    """
    with contextlib.suppress(TimeoutError, httpx.HTTPError, SseError):
        async with asyncio.timeout(AFTER_DONE_GRACE):
            read = 0
            async for _ in events:
                read += 1
                if read >= MAX_AFTER_DONE:
                    return


def _no_answer(seconds: float) -> _RetryableError:
    return _RetryableError(
        "Model provider did not answer (timeout)",
        f"the model provider did not answer within {seconds:g} s",
        kind=ProviderTimeoutError,
    )


def _timeout(exc: httpx.TimeoutException, state: _RoundState, limits: CallLimits) -> _RetryableError:
    """A client-side timeout: the connect, the pool, or the read timeout (the stall timeout)."""
    if isinstance(exc, httpx.ConnectTimeout):
        description = "provider connection failed (ConnectTimeout)"
        return _RetryableError("Model provider unreachable (connect timeout)", description)
    if not state.answering:
        # The read timeout ran out before the first byte (it is the shorter of the two).
        return _no_answer(min(limits.first_byte_timeout, limits.stall_timeout))
    return _RetryableError(
        "Model provider stalled (timeout)",
        f"provider stalled: no data for {limits.stall_timeout:g} s",
        kind=ProviderTimeoutError,
    )


async def _answer_lines(
    response: httpx.Response, timer: asyncio.Timeout, deadline: float, state: _RoundState
) -> AsyncIterator[str]:
    """The body's lines; the first one (even a comment) moves the timer to the call's deadline."""
    lines = response.aiter_lines()
    async for line in lines:
        state.answering = True
        timer.reschedule(deadline)
        yield line
        break
    async for line in lines:
        yield line


async def _status_failure(response: httpx.Response) -> Exception:
    status = response.status_code
    fault = provider_fault(await _bounded_read(response))
    description = f"API returned {status}: {fault.message}"
    if status == 429 and OUT_OF_CREDIT in {fault.code, fault.type}:
        # Out of credit is not a rate limit: waiting does not help.
        return ProviderCallError(ProviderRejectedError, description, status=status, fault=fault)
    if _retryable(status):
        retry_after = retry_after_seconds(response.headers.get("retry-after"))
        kind: type[ProviderError]
        if status == 429:
            reason, kind = "Model provider is rate limiting (429)", ProviderRateLimitedError
        else:
            reason, kind = f"Model provider failed ({status})", ProviderUnavailableError
        return _RetryableError(reason, description, kind=kind, status=status, fault=fault, retry_after=retry_after)
    kind = ProviderRejectedError if 400 <= status < 500 else ProviderError
    return ProviderCallError(kind, description, status=status, fault=fault)


def _connection_failure(exc: httpx.RequestError) -> str:
    """How a connection to the provider failed, in words (a client never reads an httpx class name)."""
    kinds: tuple[tuple[type[httpx.RequestError], str], ...] = (
        (httpx.ConnectError, "could not connect"),
        (httpx.RemoteProtocolError, "the provider broke off the exchange"),
        (httpx.ReadError, "the connection broke while reading"),
        (httpx.WriteError, "the connection broke while sending"),
        (httpx.ProxyError, "the proxy refused"),
    )
    return next((words for kind, words in kinds if isinstance(exc, kind)), "the connection failed")


def _finish(state: _RoundState) -> RoundResult:
    result = state.result
    result.text = "".join(state.text)
    result.tool_calls = [state.calls[i] for i in sorted(state.calls)]
    for call in result.tool_calls:
        call.arguments = "".join(call.fragments)
    if result.finish_reason is None and not state.done:
        raise _RetryableError(
            "Model provider stream broke off", "the provider stream ended before the answer was complete"
        )
    # `[DONE]` without a finish reason is accepted (the stream closed properly), but its reason
    # stays unknown: calling it `stop` would vouch for an answer the provider never called whole.
    if not result.text and not result.tool_calls and not result.cut_off:
        # A 200 that says nothing is not an answer: reporting it as a success would be a lie.
        msg = "The model provider returned an empty answer (no text and no tool call)"
        raise ProviderCallError(ProviderEmptyAnswerError, msg)
    return result


async def _bounded_read(response: httpx.Response) -> bytes:
    raw = b""
    async for chunk in response.aiter_bytes():
        raw += chunk
        if len(raw) >= MAX_ERROR_BODY:
            break
    return raw[:MAX_ERROR_BODY]


def _malformed(what: str) -> ProviderCallError:
    return ProviderCallError(ProviderMalformedError, f"the provider sent a malformed chunk ({what})")


async def _consume(data: str, state: _RoundState) -> None:
    try:
        chunk = json.loads(data)
    except (ValueError, RecursionError):
        raise _malformed("not JSON") from None
    if not isinstance(chunk, dict):
        raise _malformed("not an object")
    if isinstance(chunk.get("error"), dict | str):
        raise _stream_error(data)
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        model = chunk.get("model")
        state.result.usage = _usage(usage, _bounded(model, 200) if isinstance(model, str) else "")
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        return
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            await _delta(delta, state)
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            state.result.finish_reason = _token(reason) or "stop"


def _stream_error(data: str) -> ProviderCallError:
    """An error event inside a 200 stream (llama.cpp reports a context overflow this way)."""
    fault = provider_fault(data)
    message = f"the provider reported an error mid-stream: {fault.message}"
    if fault.code == CONTEXT_OVERFLOW or fault.type == "invalid_request_error":
        # The request itself was refused, exactly as a 400 would have said.
        return ProviderCallError(ProviderRejectedError, message, status=400, fault=fault)
    return ProviderCallError(ProviderError, message, fault=fault)


def _count(state: _RoundState, size: int) -> None:
    state.chars += size
    if state.chars > MAX_ROUND_CHARS:
        msg = f"the provider's answer exceeded {MAX_ROUND_CHARS} characters in one round"
        raise ProviderCallError(ProviderTooLargeError, msg)


async def _delta(delta: dict[str, Any], state: _RoundState) -> None:
    content = delta.get("content")
    if isinstance(content, str) and content:
        _count(state, len(content))
        content = replace_lone_surrogates(content)
        state.text.append(content)
        state.forwarded = True
        await state.hooks.on_text(content)
    pieces = delta.get("tool_calls")
    if isinstance(pieces, list):
        for piece in pieces:
            await _tool_delta(piece, state)


async def _tool_delta(piece: Any, state: _RoundState) -> None:
    if not isinstance(piece, dict):
        return
    index = piece.get("index") or 0
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < MAX_TOOL_CALLS:
        raise _malformed("a tool call index out of range")
    call = state.calls.setdefault(index, ToolCallBuffer())
    call_id = piece.get("id")
    if isinstance(call_id, str) and call_id:
        call.call_id = _bounded(call_id, 200)
    function = piece.get("function")
    if not isinstance(function, dict):
        return
    name = function.get("name")
    if isinstance(name, str) and name:
        call.name = _bounded(name, 200)
    fragment = function.get("arguments")
    if isinstance(fragment, str) and fragment:
        _count(state, len(fragment))
        fragment = replace_lone_surrogates(fragment)
        call.fragments.append(fragment)
        state.forwarded = True
        await state.hooks.on_tool_delta(call.call_id or f"call_{index}", call.name, fragment)


def _usage(raw: dict[str, Any], model: str) -> TokenUsage:
    def number(value: Any) -> int:
        # A provider's usage is untrusted: no negative, non-finite or 5,000-digit counts.
        if isinstance(value, bool) or not isinstance(value, int | float):
            return 0
        if isinstance(value, float) and not math.isfinite(value):
            return 0
        return int(min(max(value, 0), 1 << 53))

    details = raw.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else 0
    return TokenUsage(
        input=number(raw.get("prompt_tokens")),
        output=number(raw.get("completion_tokens")),
        cached_input=number(cached),
        total=number(raw.get("total_tokens")),
        model=model,
    )
