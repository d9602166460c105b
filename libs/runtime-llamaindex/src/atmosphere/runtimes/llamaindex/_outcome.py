"""How a run ends: the built-in runtime's error texts and codes for what went wrong.

Errors keep the built-in runtime's wording (`API returned 400: <provider message>`, `Tool loop
exhausted after N iterations`), so a client sees the same run whichever runtime served it. An
exception this module does not know (a platform error raised by the choke point, a bug)
propagates to dispatch, which ends the run with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import openai
from llama_index.core.workflow import WorkflowRuntimeError, WorkflowTimeoutError

from atmosphere.bus.errors import (
    ProviderError,
    ProviderRateLimitedError,
    ProviderRejectedError,
    ProviderTimeoutError,
    ProviderUnavailableError,
    RuntimeFailedError,
)
from atmosphere.runtimes.llamaindex._tools import ToolLoopExhaustedError

MAX_PROVIDER_MESSAGE = 500


class NoStructuredOutputError(Exception):
    """A run asked for structured output, which this runtime does not declare."""

    code = RuntimeFailedError.code

    def __init__(self) -> None:
        """Say why, and what to do instead."""
        super().__init__(
            "the llamaindex runtime has no structured output: LlamaIndex's agents cannot heal an answer that "
            "does not match the schema; serve this agent with a runtime that declares STRUCTURED_OUTPUT"
        )


class UnhostableError(Exception):
    """The runtime was given a framework object it cannot run."""

    code = RuntimeFailedError.code


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
    if isinstance(exc, openai.APIError):
        return _provider_failure(exc)
    if isinstance(exc, WorkflowTimeoutError):
        return Failure(f"the LlamaIndex workflow timed out: {exc}", RuntimeFailedError.code)
    if isinstance(exc, WorkflowRuntimeError):
        # LlamaIndex's own limits (its iteration cap) and its workflow's failures.
        return Failure(str(exc), RuntimeFailedError.code)
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
