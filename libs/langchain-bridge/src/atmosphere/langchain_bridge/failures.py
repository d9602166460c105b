"""How a run's failures end it: the built-in runtime's error texts and codes, so clients see one platform.

A failure the run can name (the provider refused, timed out, the tool loop ran out) ends the run with
an `error` terminal; anything else propagates, and dispatch reports it as the runtime failing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

import openai
from langchain_core.exceptions import ModelError

from atmosphere.bus import errors as catalogue
from atmosphere.bus.errors import (
    OUT_OF_CREDIT,
    ProviderError,
    ProviderRateLimitedError,
    ProviderRejectedError,
    ProviderTimeoutError,
    ProviderUnavailableError,
)

# The catalogue's wire codes (`atmosphere.bus.errors`): the built-in runtime's, so clients see one platform.
TOOL_LOOP_EXHAUSTED = catalogue.ToolLoopExhaustedError.code
PROVIDER_ERROR = ProviderError.code
PROVIDER_REJECTED = ProviderRejectedError.code
PROVIDER_RATE_LIMITED = ProviderRateLimitedError.code
PROVIDER_UNAVAILABLE = ProviderUnavailableError.code
PROVIDER_TIMEOUT = ProviderTimeoutError.code

MAX_PROVIDER_MESSAGE = 500
"""What the provider says is untrusted: at most this much of it reaches the client."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Failure:
    """The error terminal a run ends with."""

    message: str
    code: str
    retryable: bool = False


class ToolLoopExhaustedError(Exception):
    """The model asked for tools once more than a strict tool loop allows."""

    def __init__(self, cap: int) -> None:
        """Name the cap, in the built-in runtime's words."""
        super().__init__(f"Tool loop exhausted after {cap} iterations")


class CallDeadlineError(Exception):
    """One model call outlived `RuntimeConfig.call_timeout`."""


async def within_deadline(seconds: float, call: Awaitable[T]) -> T:
    """Await `call`, cut at `seconds`: a provider that only sends keep-alives must not hold a run forever.

    Raises:
        CallDeadlineError: the deadline passed.
    """
    deadline = asyncio.timeout(seconds)
    try:
        async with deadline:
            return await call
    except TimeoutError:
        if not deadline.expired():
            raise  # not ours: a timeout inside the call has its own meaning
        msg = f"the model call exceeded its {seconds:g} s deadline"
        raise CallDeadlineError(msg) from None


def failure_of(exc: Exception) -> Failure | None:
    """The terminal `exc` ends the run with, or None when it is not a failure a run can name."""
    if isinstance(exc, ToolLoopExhaustedError):
        return Failure(str(exc), TOOL_LOOP_EXHAUSTED)
    if isinstance(exc, CallDeadlineError):
        return Failure(str(exc), PROVIDER_TIMEOUT, retryable=True)
    if isinstance(exc, openai.APIError):
        return _openai_failure(exc)
    if isinstance(exc, ModelError):
        # A hosted object's own model, of any provider LangChain knows.
        return Failure(f"the model provider failed: {_bounded(str(exc))}", PROVIDER_ERROR, exc.is_retryable)
    return None


def _openai_failure(exc: openai.APIError) -> Failure:
    if isinstance(exc, openai.APIStatusError):
        return _status_failure(exc)
    if isinstance(exc, openai.APITimeoutError):
        return Failure("the model provider did not answer in time", PROVIDER_TIMEOUT, retryable=True)
    if isinstance(exc, openai.APIConnectionError):
        return Failure("provider connection failed", PROVIDER_UNAVAILABLE, retryable=True)
    # An error event inside a 200 stream.
    return Failure(f"the provider reported an error mid-stream: {_provider_message(exc)}", PROVIDER_ERROR)


def _status_failure(exc: openai.APIStatusError) -> Failure:
    """An HTTP error the SDK gave up on (it retried 408, 429 and 5xx first)."""
    status = exc.status_code
    message = f"API returned {status}: {_provider_message(exc)}"
    body = exc.body if isinstance(exc.body, dict) else {}
    if status == 429 and OUT_OF_CREDIT in {body.get("code"), body.get("type")}:
        return Failure(message, PROVIDER_REJECTED)
    if status == 429:
        return Failure(message, PROVIDER_RATE_LIMITED, retryable=True)
    if status == 408 or status >= 500:
        return Failure(message, PROVIDER_UNAVAILABLE, retryable=True)
    if status >= 400:
        return Failure(message, PROVIDER_REJECTED)
    return Failure(message, PROVIDER_ERROR)


def _provider_message(exc: openai.APIError) -> str:
    """The provider's own words: the `message` of its error body (the SDK strips the `error` wrapper)."""
    body = exc.body
    said = body.get("message") if isinstance(body, dict) else body
    return _bounded(said) if isinstance(said, str) and said.strip() else "no details"


def _bounded(text: str) -> str:
    return text[:MAX_PROVIDER_MESSAGE].strip()
