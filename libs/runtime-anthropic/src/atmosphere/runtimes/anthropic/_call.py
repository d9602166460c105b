"""One model round against Anthropic's Messages API: the streamed call, its deadlines, its retries.

The retries are this module's, not the SDK's (its client runs with `max_retries=0`): the SDK
would retry 429 and 529 honouring `retry-after`, but with its own backoff, uncapped waits and no
word to the client, where the run's `RetryPolicy` sets the delays, caps a `retry-after` at its
`max_delay`, and a status line says why the answer is late. So, as the built-in runtime does:

- retried (within `retry_window`): connection failures, no answer in time, 408, 429, 5xx
  (Anthropic's 529 `overloaded_error` included), an `overloaded_error` or `api_error` event
  mid-stream, a stream that broke off — but only while nothing of the round reached the client;
- never retried: other statuses, an answer `x-should-retry: false` says not to, and any failure
  after text or a tool-call fragment was forwarded;
- deadlines: the first event within `first_byte_timeout` (headers alone do not count), no
  silence longer than `stall_timeout` (the HTTP read timeout), the whole call within
  `call_timeout`, retries included.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import anthropic

from atmosphere.runtimes.anthropic._errors import (
    PROVIDER_EMPTY_ANSWER,
    PROVIDER_ERROR,
    PROVIDER_MALFORMED,
    PROVIDER_RATE_LIMITED,
    PROVIDER_REJECTED,
    PROVIDER_TIMEOUT,
    PROVIDER_UNAVAILABLE,
)
from atmosphere.runtimes.anthropic._stream import RoundHooks, RoundResult, RoundState, replace_lone_surrogates
from atmosphere.sdk import RetryPolicy
from atmosphere.sdk.runtime import RuntimeConfig
from atmosphere.sdk.runtime_errors import RunFailedError

log = logging.getLogger("atmosphere.runtimes.anthropic")

MAX_PROVIDER_MESSAGE = 500
RETRYABLE_STATUS = frozenset({408, 429})
RETRYABLE_STREAM_ERRORS = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})
"""Error events mid-stream that another attempt may not meet (Anthropic's transient kinds)."""


@dataclass(frozen=True, slots=True)
class CallLimits:
    """The deadlines of one model call (see the module docstring)."""

    first_byte_timeout: float = 10.0
    call_timeout: float = 300.0
    retry_window: float = 20.0
    stall_timeout: float = 30.0

    @classmethod
    def of(cls, config: RuntimeConfig) -> CallLimits:
        """The limits configured for the runtime."""
        return cls(config.first_byte_timeout, config.call_timeout, config.retry_window, config.stall_timeout)


class _RetryableError(Exception):
    """An attempt failed in a way another attempt may not (nothing of it reached the client yet)."""

    def __init__(
        self,
        reason: str,
        description: str,
        *,
        code: str = PROVIDER_UNAVAILABLE,
        status: int | None = None,
        provider_code: str = "",
        retry_after: float | None = None,
    ) -> None:
        super().__init__(description)
        self.reason = reason
        """Short, for the status line: "Model provider is overloaded (529)"."""
        self.description = description
        """Precise, for the final error: "API returned 529: Overloaded"."""
        self.code = code
        self.status = status
        self.provider_code = provider_code
        self.retry_after = retry_after

    def final(self, attempts: int) -> RunFailedError:
        """The error that ends the call after `attempts` attempts."""
        message = self.description if attempts == 1 else f"Failed after {attempts} attempts: {self.description}"
        return RunFailedError(
            self.code,
            message,
            retryable=True,
            status=self.status,
            provider_code=self.provider_code,
            retry_after=self.retry_after,
        )


async def stream_round(
    client: anthropic.AsyncAnthropic,
    params: dict[str, Any],
    *,
    retry: RetryPolicy,
    hooks: RoundHooks,
    limits: CallLimits,
) -> RoundResult:
    """Run one streamed round, retrying only while nothing of it has reached the client.

    Raises:
        RunFailedError: the round failed for good.
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + limits.call_timeout
    attempts = retry.max_retries + 1
    for attempt in range(1, attempts + 1):
        state = RoundState(hooks)
        try:
            return await _attempt(client, params, state, limits, deadline)
        except _RetryableError as failure:
            if state.forwarded:
                raise failure.final(1) from None
            delay = retry.delay(attempt - 1, retry_after=failure.retry_after)
            now = loop.time()
            in_window = now - started + delay <= limits.retry_window and now + delay < deadline
            if attempt == attempts or not in_window:
                raise failure.final(attempt) from None
            log.info(
                "anthropic call failed (%s); retry %d/%d in %.2fs", failure.description, attempt, attempts - 1, delay
            )
            if hooks.on_retry is not None:
                await hooks.on_retry(
                    f"{failure.reason}; retrying in {_seconds(delay)} (attempt {attempt + 1} of {attempts})"
                )
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


async def _attempt(
    client: anthropic.AsyncAnthropic, params: dict[str, Any], state: RoundState, limits: CallLimits, deadline: float
) -> RoundResult:
    loop = asyncio.get_running_loop()
    first_byte_by = min(loop.time() + limits.first_byte_timeout, deadline)
    timer = asyncio.timeout_at(first_byte_by)
    try:
        async with timer:
            stream = await client.messages.create(**params, stream=True)
            # Leaving this block, by the end, an error or a cancellation, closes the HTTP response.
            async with stream:
                async for event in stream:
                    if not state.answering:
                        timer.reschedule(deadline)
                    await state.consume(event)
    except TimeoutError:
        if not timer.expired():
            raise  # not ours: e.g. a timeout in a hook
        if state.answering or first_byte_by >= deadline:
            msg = f"the model call exceeded its {limits.call_timeout:g} s deadline"
            raise RunFailedError(PROVIDER_TIMEOUT, msg, retryable=True) from None
        raise _no_answer(limits.first_byte_timeout) from None
    except anthropic.APIStatusError as exc:
        raise _status_failure(exc) from None
    except anthropic.APITimeoutError:
        raise _timeout(state, limits) from None
    except anthropic.APIConnectionError as exc:
        description = f"provider connection failed ({_bounded(exc.message)})"
        raise _RetryableError("Model provider unreachable (connection failed)", description) from None
    except ValueError:  # an event whose data is not JSON (the SDK decodes it as it reads)
        raise RunFailedError(PROVIDER_MALFORMED, "the provider sent a malformed event") from None
    return _finish(state)


def _finish(state: RoundState) -> RoundResult:
    result = state.result()
    if result.stop_reason is None and not state.stopped:
        raise _RetryableError(
            "Model provider stream broke off", "the provider stream ended before the answer was complete"
        )
    if not result.text and not result.tool_calls and not result.cut_off:
        # A 200 that says nothing is not an answer: reporting it as a success would be a lie.
        msg = "The model provider returned an empty answer (no text and no tool call)"
        raise RunFailedError(PROVIDER_EMPTY_ANSWER, msg)
    return result


def _no_answer(seconds: float) -> _RetryableError:
    return _RetryableError(
        "Model provider did not answer (timeout)",
        f"the model provider did not answer within {seconds:g} s",
        code=PROVIDER_TIMEOUT,
    )


def _timeout(state: RoundState, limits: CallLimits) -> _RetryableError:
    """The HTTP client's own timeout: connecting, or the read timeout (the stall timeout)."""
    if not state.answering:
        return _no_answer(min(limits.first_byte_timeout, limits.stall_timeout))
    return _RetryableError(
        "Model provider stalled (timeout)",
        f"provider stalled: no data for {limits.stall_timeout:g} s",
        code=PROVIDER_TIMEOUT,
    )


def _status_failure(exc: anthropic.APIStatusError) -> Exception:
    """An error status, or an `error` event in a 200 stream (the SDK raises both alike)."""
    status = exc.status_code
    message = _bounded(exc.api_message or _body_text(exc.body)) or "no details"
    provider_code = _token(exc.error_code) or _token(exc.type)
    if status < 400:
        return _stream_error(exc.type or "", message, provider_code)
    description = f"API returned {status}: {message}"
    headers = exc.response.headers
    may_retry = headers.get("x-should-retry") != "false"
    if may_retry and (status in RETRYABLE_STATUS or 500 <= status <= 599):
        retry_after = retry_after_seconds(headers.get("retry-after-ms"), headers.get("retry-after"))
        if status == 429:
            reason, code = "Model provider is rate limiting (429)", PROVIDER_RATE_LIMITED
        elif status == 529:
            reason, code = "Model provider is overloaded (529)", PROVIDER_UNAVAILABLE
        else:
            reason, code = f"Model provider failed ({status})", PROVIDER_UNAVAILABLE
        return _RetryableError(
            reason, description, code=code, status=status, provider_code=provider_code, retry_after=retry_after
        )
    code = PROVIDER_REJECTED if 400 <= status < 500 else PROVIDER_ERROR
    return RunFailedError(code, description, status=status, provider_code=provider_code)


def _stream_error(kind: str, message: str, provider_code: str) -> Exception:
    description = f"the provider reported an error mid-stream: {message}"
    if kind in RETRYABLE_STREAM_ERRORS:
        return _RetryableError(f"Model provider failed mid-stream ({kind})", description, provider_code=provider_code)
    if kind == "invalid_request_error":
        # The request itself was refused, exactly as a 400 would have said.
        return RunFailedError(PROVIDER_REJECTED, description, status=400, provider_code=provider_code)
    return RunFailedError(PROVIDER_ERROR, description, provider_code=provider_code)


def retry_after_seconds(milliseconds: str | None, value: str | None) -> float | None:
    """How long the provider asks to wait: `retry-after-ms`, else `retry-after` (seconds or an HTTP date)."""
    for text, scale in ((milliseconds, 1000.0), (value, 1.0)):
        if not text:
            continue
        try:
            seconds = float(text) / scale
        except ValueError:
            continue
        return max(0.0, seconds) if math.isfinite(seconds) else None
    if not value:
        return None
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, moment.timestamp() - time.time())


def _body_text(body: object) -> str:
    return body if isinstance(body, str) else ""


def _bounded(text: str, limit: int = MAX_PROVIDER_MESSAGE) -> str:
    return replace_lone_surrogates(text[:limit]).strip()


def _token(value: object) -> str:
    """An identifier-like field of a provider error, or "" when it is not one."""
    if not isinstance(value, str) or not 0 < len(value) <= 64:
        return ""
    return value if all(c.isalnum() or c in "_.:-" for c in value) and value.isascii() else ""


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s".replace(".0 s", " s")
