"""How a run ends: the built-in runtime's error texts and codes for what went wrong.

Errors keep the built-in runtime's wording (`API returned 400: <provider message>`, `Tool loop
exhausted after N iterations`), so a client sees the same run whichever runtime served it. A
platform error the choke point raised is not this module's: it propagates to dispatch as raised.
What CrewAI itself raised (a task it could not finish, a template it could not fill) ends the run
as a runtime failure with CrewAI's words.
"""

from __future__ import annotations

from dataclasses import dataclass

import openai

from atmosphere.bus.errors import (
    ProviderError,
    ProviderRateLimitedError,
    ProviderRejectedError,
    ProviderTimeoutError,
    ProviderUnavailableError,
    RuntimeFailedError,
)
from atmosphere.runtimes.crewai._crew import UnhostableCrewError
from atmosphere.runtimes.crewai._tools import ToolLoopExhaustedError

MAX_PROVIDER_MESSAGE = 500
MAX_CAUSES = 8
"""How deep a cause chain is searched for the provider's error (CrewAI wraps some)."""


class NoStructuredOutputError(Exception):
    """A run asked for structured output, which this runtime does not declare."""

    code = RuntimeFailedError.code

    def __init__(self) -> None:
        """Say why, and what to do instead."""
        super().__init__(
            "the crewai runtime has no structured output: CrewAI converts a task's answer once and cannot heal "
            "one that does not match the schema; serve this agent with a runtime that declares STRUCTURED_OUTPUT"
        )


@dataclass(frozen=True, slots=True)
class Failure:
    """The error a run ends with."""

    message: str
    code: str
    retryable: bool = False


def failure_of(exc: BaseException) -> Failure | None:
    """The error for `exc`, or None when it is the platform's own (raised by the choke point)."""
    if isinstance(exc, ToolLoopExhaustedError | UnhostableCrewError | NoStructuredOutputError):
        return Failure(str(exc), exc.code)
    provider = _provider_error(exc)
    if provider is not None:
        return _provider_failure(provider)
    if type(exc).__module__.startswith("atmosphere."):
        return None
    return Failure(
        f"the crew failed: {exc}" if str(exc) else f"the crew failed ({type(exc).__name__})", RuntimeFailedError.code
    )


def _provider_error(exc: BaseException) -> openai.APIError | None:
    current: BaseException | None = exc
    for _ in range(MAX_CAUSES):
        if current is None:
            return None
        if isinstance(current, openai.APIError):
            return current
        current = current.__cause__ or current.__context__
    return None


def _provider_failure(exc: openai.APIError) -> Failure:
    """The OpenAI client's failure once its retries are spent."""
    if isinstance(exc, openai.APIStatusError):
        return http_failure(exc.status_code, exc.body)
    if isinstance(exc, openai.APITimeoutError):
        return Failure("the model provider did not answer in time", ProviderTimeoutError.code, retryable=True)
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
