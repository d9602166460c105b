"""One model round against an OpenAI-compatible provider: the HTTP call, retries, parsing."""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from atmosphere.dispatch.runtime.sse import SseError, sse_data
from atmosphere.sdk import RetryPolicy, TokenUsage

log = logging.getLogger("atmosphere.dispatch.runtime")

RETRYABLE_STATUS = frozenset({408, 429})
MAX_ERROR_BODY = 64 * 1024


class ProviderError(Exception):
    """The provider call failed for good; the message is safe to show to the client."""

    def __init__(self, message: str, *, status: int | None = None, code: str = "provider.error") -> None:
        self.status = status
        self.code = code
        super().__init__(message)


@dataclass
class ToolCallBuffer:
    """A tool call being assembled from streamed fragments."""

    call_id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass
class RoundResult:
    """What one streamed model round produced."""

    text: str = ""
    tool_calls: list[ToolCallBuffer] = field(default_factory=list)
    finish_reason: str | None = None
    usage: TokenUsage | None = None


@dataclass(frozen=True)
class RoundHooks:
    """Where a round's pieces go as they arrive."""

    on_text: Callable[[str], Awaitable[None]]
    on_tool_delta: Callable[[str, str, str], Awaitable[None]]
    """(call id, tool name, arguments fragment)."""


def retry_after_seconds(value: str | None) -> float | None:
    """`Retry-After` as seconds: either a number or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, moment.timestamp() - time.time())


def _provider_message(raw: bytes) -> str:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return raw[:300].decode(errors="replace").strip() or "no details"
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:500]
        if isinstance(error, str):
            return error[:500]
        if isinstance(body.get("message"), str):
            return str(body["message"])[:500]
    return json.dumps(body)[:300]


def _retryable(status: int) -> bool:
    return status in RETRYABLE_STATUS or 500 <= status <= 599


class _RetryableError(Exception):
    def __init__(self, description: str, retry_after: float | None = None) -> None:
        self.description = description
        self.retry_after = retry_after
        super().__init__(description)


async def stream_round(
    client: httpx.AsyncClient,
    *,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    retry: RetryPolicy,
    hooks: RoundHooks,
) -> RoundResult:
    """Run one streamed round, retrying only while nothing of it has reached the client.

    Retried: connection failures, 408, 429, 5xx, a stream that broke before any output.
    Never retried: other statuses, and any failure after text or a tool-call fragment was
    forwarded (the client already saw part of the answer).
    """
    attempts = retry.max_retries + 1
    for attempt in range(attempts):
        state = _RoundState(hooks)
        try:
            return await _attempt(client, url, body, headers, state)
        except _RetryableError as failure:
            if state.forwarded or attempt == attempts - 1:
                if attempts > 1 and not state.forwarded:
                    msg = f"Failed after {attempt + 1} attempts: {failure.description}"
                    raise ProviderError(msg, code="provider.unavailable") from None
                raise ProviderError(failure.description, code="provider.unavailable") from None
            delay = retry.delay(attempt, retry_after=failure.retry_after)
            log.info(
                "provider call failed (%s); retry %d/%d in %.2fs",
                failure.description,
                attempt + 1,
                retry.max_retries,
                delay,
            )
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


class _RoundState:
    def __init__(self, hooks: RoundHooks) -> None:
        self.hooks = hooks
        self.result = RoundResult()
        self.forwarded = False
        self.calls: dict[int, ToolCallBuffer] = {}
        self.done = False


async def _attempt(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str], state: _RoundState
) -> RoundResult:
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                raw = await _bounded_read(response)
                description = f"API returned {response.status_code}: {_provider_message(raw)}"
                if _retryable(response.status_code):
                    raise _RetryableError(description, retry_after_seconds(response.headers.get("retry-after")))
                raise ProviderError(description, status=response.status_code)
            async for data in sse_data(response.aiter_lines()):
                if data.strip() == "[DONE]":
                    state.done = True
                    break
                await _consume(data, state)
    except (
        httpx.ConnectError,
        httpx.ConnectTimeout,
        httpx.RemoteProtocolError,
        httpx.ReadError,
        httpx.WriteError,
    ) as exc:
        raise _RetryableError(f"provider connection failed ({type(exc).__name__})") from None
    except httpx.ReadTimeout:
        raise _RetryableError("provider stalled: no data within the stall timeout") from None
    except SseError as exc:
        raise ProviderError(str(exc), code="provider.malformed") from None
    result = state.result
    result.tool_calls = [state.calls[i] for i in sorted(state.calls)]
    if result.finish_reason is None and not state.done:
        raise _RetryableError("the provider stream ended before the answer was complete")
    if result.finish_reason is None:
        # `[DONE]` without a finish reason: accept, the stream closed properly.
        result.finish_reason = "tool_calls" if result.tool_calls else "stop"
    return result


async def _bounded_read(response: httpx.Response) -> bytes:
    raw = b""
    async for chunk in response.aiter_bytes():
        raw += chunk
        if len(raw) >= MAX_ERROR_BODY:
            break
    return raw[:MAX_ERROR_BODY]


async def _consume(data: str, state: _RoundState) -> None:
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError:
        msg = "the provider sent a malformed chunk (not JSON)"
        raise ProviderError(msg, code="provider.malformed") from None
    if not isinstance(chunk, dict):
        msg = "the provider sent a malformed chunk (not an object)"
        raise ProviderError(msg, code="provider.malformed")
    if isinstance(chunk.get("error"), dict | str):
        msg = f"the provider reported an error mid-stream: {_provider_message(data.encode())}"
        raise ProviderError(msg)
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        state.result.usage = _usage(usage, str(chunk.get("model") or ""))
    for choice in chunk.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta") or {}
        content = delta.get("content")
        if isinstance(content, str) and content:
            state.result.text += content
            state.forwarded = True
            await state.hooks.on_text(content)
        for piece in delta.get("tool_calls") or []:
            await _tool_delta(piece, state)
        if choice.get("finish_reason"):
            state.result.finish_reason = str(choice["finish_reason"])


async def _tool_delta(piece: Any, state: _RoundState) -> None:
    if not isinstance(piece, dict):
        return
    index = int(piece.get("index") or 0)
    call = state.calls.setdefault(index, ToolCallBuffer())
    if piece.get("id"):
        call.call_id = str(piece["id"])
    function = piece.get("function") or {}
    if function.get("name"):
        call.name = str(function["name"])
    fragment = function.get("arguments")
    if isinstance(fragment, str) and fragment:
        call.arguments += fragment
        state.forwarded = True
        await state.hooks.on_tool_delta(call.call_id or f"call_{index}", call.name, fragment)


def _usage(raw: dict[str, Any], model: str) -> TokenUsage:
    def number(key: str) -> int:
        value = raw.get(key)
        return int(value) if isinstance(value, int | float) else 0

    details = raw.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else 0
    return TokenUsage(
        input=number("prompt_tokens"),
        output=number("completion_tokens"),
        cached_input=int(cached or 0),
        total=number("total_tokens"),
        model=model,
    )
