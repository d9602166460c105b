"""How a run ends: the built-in runtime's error texts and codes for what went wrong.

Errors keep the built-in runtime's wording (`API returned 400: <provider message>`, `Tool loop
exhausted after N iterations`), so a client sees the same run whichever runtime served it. SK
wraps a provider's error in its own `ServiceResponseException`: the OpenAI client's error behind
it is what is described. An exception this module does not know (a platform error raised by the
choke point, a bug) propagates to dispatch, which ends the run with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import openai
from semantic_kernel.exceptions import KernelException

from atmosphere.bus.errors import (
    ProviderError,
    ProviderRateLimitedError,
    ProviderRejectedError,
    ProviderTimeoutError,
    ProviderUnavailableError,
    RuntimeFailedError,
)
from atmosphere.runtimes.semantic_kernel._tools import ToolLoopExhaustedError

MAX_PROVIDER_MESSAGE = 500


class NoStructuredOutputError(Exception):
    """A run asked for structured output, which this runtime does not declare."""

    code = RuntimeFailedError.code

    def __init__(self) -> None:
        """Say why, and what to do instead."""
        super().__init__(
            "the semantic-kernel runtime has no structured output: Semantic Kernel cannot heal an answer that "
            "does not match the schema; serve this agent with a runtime that declares STRUCTURED_OUTPUT"
        )


class UnhostableError(Exception):
    """The hosted object is not one this runtime can run."""

    code = RuntimeFailedError.code

    def __init__(self, native: object) -> None:
        """Name what was given."""
        super().__init__(f"the semantic-kernel runtime cannot host a {type(native).__qualname__}")


@dataclass(frozen=True, slots=True)
class Failure:
    """The error a run ends with."""

    message: str
    code: str
    retryable: bool = False


def failure_of(exc: BaseException) -> Failure | None:
    """The error for `exc`, or None when it is not this runtime's to describe."""
    if isinstance(exc, ToolLoopExhaustedError | NoStructuredOutputError | UnhostableError):
        return Failure(str(exc), exc.code)
    transport = _cause(exc, (openai.APIError, httpx.TransportError))
    if isinstance(transport, openai.APIError):
        return _provider_failure(transport)
    if isinstance(transport, httpx.TimeoutException):
        return _timed_out()
    if isinstance(transport, httpx.TransportError):
        return Failure("provider connection failed", ProviderUnavailableError.code, retryable=True)
    if isinstance(exc, KernelException):
        return Failure(str(exc), RuntimeFailedError.code)
    return None


def _cause(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """`exc`, or the first exception of `kinds` among those it was raised from."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kinds):
            return current
        seen.add(id(current))
        current = current.__cause__  # what it was raised from, not what was being handled (a bug stays a bug)
    return None


def _timed_out() -> Failure:
    return Failure("the model provider did not answer in time", ProviderTimeoutError.code, retryable=True)


def _provider_failure(exc: openai.APIError) -> Failure:
    """The OpenAI client's failure once its retries are spent."""
    if isinstance(exc, openai.APIStatusError):
        return http_failure(exc.status_code, exc.body)
    if isinstance(exc, openai.APITimeoutError):
        return _timed_out()
    if isinstance(exc, openai.APIConnectionError):
        return Failure("provider connection failed", ProviderUnavailableError.code, retryable=True)
    # An error event inside a 200 stream (e.g. llama.cpp refusing mid-answer).
    return Failure(f"the provider reported an error mid-stream: {provider_message(exc.body)}", ProviderError.code)


def http_failure(status: int, body: object) -> Failure:
    """A provider's HTTP error, as the built-in runtime reports it once its retries are spent."""
    message = f"API returned {status}: {provider_message(body)}"
    if status == 429:
        return Failure(message, ProviderRateLimitedError.code, retryable=True)
    if status == 408 or status >= 500:
        return Failure(message, ProviderUnavailableError.code, retryable=True)
    return Failure(message, ProviderRejectedError.code if status >= 400 else ProviderError.code)


def provider_message(body: object) -> str:
    """The provider's own words from an error body (OpenAI's `{"message": ...}`, possibly inside `error`)."""
    error = body.get("error", body) if isinstance(body, dict) else body
    message = error.get("message") if isinstance(error, dict) else error
    if isinstance(message, str) and message.strip():
        return message.strip()[:MAX_PROVIDER_MESSAGE]
    return "no details"
