"""ADK's `Gemini` model with the run's retries and deadlines: one per run, on the runtime's client.

The retries are this module's, not `google-genai`'s (its client runs without `retry_options`,
which means no retry): the SDK's backoff ignores `Retry-After`, where the run's `RetryPolicy`
sets the delays, honours the provider's delay (the `Retry-After` header, else Google's
`RetryInfo` detail) up to its `max_delay`, and a status line says why the answer is late. So,
as the built-in runtime does:

- retried (within `retry_window`): connection failures, no answer in time, 408, 429 and 5xx,
  an error event mid-stream — but only while nothing of the round reached the client;
- never retried: other statuses, an answer that does not parse, and any failure after part of
  the round was handed to ADK (and so, possibly, to the client);
- deadlines: the first chunk within `first_byte_timeout`, no silence longer than
  `stall_timeout` (the HTTP read timeout), retries only while `call_timeout` allows.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import math
import re
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import httpx
from google.adk.models.google_llm import Gemini
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import errors as genai_errors
from pydantic import PrivateAttr

from atmosphere.runtimes.adk._errors import (
    PROVIDER_ERROR,
    PROVIDER_MALFORMED,
    PROVIDER_RATE_LIMITED,
    PROVIDER_REJECTED,
    PROVIDER_TIMEOUT,
    PROVIDER_UNAVAILABLE,
    bounded,
)
from atmosphere.sdk import RetryPolicy
from atmosphere.sdk.runtime import RuntimeConfig
from atmosphere.sdk.runtime_errors import RunFailedError

log = logging.getLogger("atmosphere.runtimes.adk")

RETRYABLE_STATUS = frozenset({408, 429})
_RETRY_DELAY = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s*$")
OnRetry = Callable[[str], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class CallLimits:
    """The deadlines of one model call (see the module docstring)."""

    first_byte_timeout: float = 10.0
    call_timeout: float = 300.0
    retry_window: float = 20.0

    @classmethod
    def of(cls, config: RuntimeConfig) -> CallLimits:
        """The limits configured for the runtime."""
        return cls(config.first_byte_timeout, config.call_timeout, config.retry_window)


@dataclass
class Pacing:
    """What one run's model calls share: the retry policy, the deadlines, the status line, the round count."""

    retry: RetryPolicy
    limits: CallLimits
    on_retry: OnRetry | None = None
    rounds: int = 0
    """Model calls begun so far (a retry is the same round)."""


class PacedGemini(Gemini):
    """`Gemini` whose every call is paced by the run's `Pacing` (retries, first-byte deadline, rounds)."""

    _pacing: Pacing = PrivateAttr(default_factory=lambda: Pacing(RetryPolicy(max_retries=0), CallLimits()))

    def paced(self, pacing: Pacing) -> PacedGemini:
        """This model, paced by `pacing` (the run's)."""
        self._pacing = pacing
        return self

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        """ADK's call, retried while nothing of it was handed on (see the module docstring).

        Raises:
            RunFailedError: the round failed for good.
        """
        pacing = self._pacing
        pacing.rounds += 1
        loop = asyncio.get_running_loop()
        started = loop.time()
        attempts = pacing.retry.max_retries + 1
        for attempt in range(1, attempts + 1):
            handed_on = False
            try:
                async with aclosing(super().generate_content_async(llm_request, stream)) as responses:
                    async with asyncio.timeout(pacing.limits.first_byte_timeout):
                        first = await anext(responses, None)
                    if first is None:
                        return
                    handed_on = True
                    yield first
                    async for response in responses:
                        yield response
                return
            except Exception as exc:
                failure = _failure(exc, pacing.limits)
                if failure is None:
                    raise
                if handed_on or not isinstance(failure, _RetryableError):
                    raise (failure.final(1) if isinstance(failure, _RetryableError) else failure) from exc
                delay = pacing.retry.delay(attempt - 1, retry_after=failure.retry_after)
                elapsed = loop.time() - started
                in_window = (
                    elapsed + delay <= pacing.limits.retry_window and elapsed + delay < pacing.limits.call_timeout
                )
                if attempt == attempts or not in_window:
                    raise failure.final(attempt) from exc
                log.info(
                    "gemini call failed (%s); retry %d/%d in %.2fs", failure.description, attempt, attempts - 1, delay
                )
                if pacing.on_retry is not None:
                    await pacing.on_retry(
                        f"{failure.reason}; retrying in {_seconds(delay)} (attempt {attempt + 1} of {attempts})"
                    )
                await asyncio.sleep(delay)


class _RetryableError(Exception):
    """An attempt failed in a way another attempt may not."""

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
        """Short, for the status line: "Model provider is rate limiting (429)"."""
        self.description = description
        """Precise, for the final error: "API returned 429: Quota exceeded"."""
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


def _failure(exc: Exception, limits: CallLimits) -> _RetryableError | RunFailedError | None:
    """What a failed attempt means; None for an exception that is not the provider's (a tool's, a bug)."""
    if isinstance(exc, genai_errors.APIError):
        return _status_failure(exc)
    if isinstance(exc, genai_errors.UnknownApiResponseError):
        return RunFailedError(PROVIDER_MALFORMED, "the provider sent a malformed event")
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        seconds = limits.first_byte_timeout if isinstance(exc, TimeoutError) else None
        within = f" within {seconds:g} s" if seconds is not None else " in time"
        return _RetryableError(
            "Model provider did not answer (timeout)",
            f"the model provider did not answer{within}",
            code=PROVIDER_TIMEOUT,
        )
    if isinstance(exc, httpx.TransportError):
        return _RetryableError(
            "Model provider unreachable (connection failed)", f"provider connection failed ({bounded(str(exc))})"
        )
    return None


def _status_failure(exc: genai_errors.APIError) -> _RetryableError | RunFailedError:
    status = exc.code if isinstance(exc.code, int) else 0
    message = bounded(exc.message if isinstance(exc.message, str) else "") or "no details"
    provider_code = exc.status if isinstance(exc.status, str) else ""
    description = f"API returned {status}: {message}"
    if status in RETRYABLE_STATUS or 500 <= status <= 599:
        retry_after = retry_after_seconds(_header(exc, "retry-after"), exc.details)
        if status == 429:
            reason, code = "Model provider is rate limiting (429)", PROVIDER_RATE_LIMITED
        else:
            reason, code = f"Model provider failed ({status})", PROVIDER_UNAVAILABLE
        return _RetryableError(
            reason, description, code=code, status=status, provider_code=provider_code, retry_after=retry_after
        )
    code = PROVIDER_REJECTED if 400 <= status < 500 else PROVIDER_ERROR
    return RunFailedError(code, description, status=status or None, provider_code=provider_code)


def _header(exc: genai_errors.APIError, name: str) -> str | None:
    headers = getattr(exc.response, "headers", None)
    value = headers.get(name) if headers is not None else None
    return value if isinstance(value, str) else None


def retry_after_seconds(header: str | None, details: Any) -> float | None:
    """How long the provider asks to wait: `Retry-After` (seconds or an HTTP date), else Google's `RetryInfo`."""
    if header:
        try:
            seconds = float(header)
        except ValueError:
            try:
                moment = email.utils.parsedate_to_datetime(header)
            except (TypeError, ValueError, IndexError):
                moment = None
            if moment is not None:
                return max(0.0, moment.timestamp() - time.time())
        else:
            return max(0.0, seconds) if math.isfinite(seconds) else None
    return _retry_info(details)


def _retry_info(details: Any) -> float | None:
    """The `retryDelay` ("1.5s") of a `google.rpc.RetryInfo` in an error body's `details`."""
    error = details.get("error") if isinstance(details, dict) else None
    entries = error.get("details") if isinstance(error, dict) else None
    for entry in entries if isinstance(entries, list) else ():
        delay = entry.get("retryDelay") if isinstance(entry, dict) else None
        found = _RETRY_DELAY.match(delay) if isinstance(delay, str) else None
        if found:
            return float(found.group(1))
    return None


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s".replace(".0 s", " s")
