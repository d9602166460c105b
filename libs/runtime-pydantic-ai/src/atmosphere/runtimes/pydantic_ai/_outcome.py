"""How a run ends: the built-in runtime's error texts and codes for what went wrong, and the structured entity.

Errors keep the built-in runtime's wording (`API returned 400: <provider message>`, `Tool loop
exhausted after N iterations`), so a client sees the same run whichever runtime served it. An
exception this module does not know (a platform error raised by the choke point, a bug)
propagates to dispatch, which ends the run with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pydantic
from pydantic import BaseModel
from pydantic_ai import AgentRunError, ModelAPIError, ModelHTTPError, ModelTimeoutError, UnexpectedModelBehavior

from atmosphere.bus import errors as catalogue
from atmosphere.bus.errors import (
    ProviderError,
    ProviderMalformedError,
    ProviderRateLimitedError,
    ProviderRejectedError,
    ProviderTimeoutError,
    ProviderUnavailableError,
    RuntimeFailedError,
)
from atmosphere.contracts.run.v1.run_pb2 import EntityComplete, EntityStart, RunEvent, StructuredField
from atmosphere.runtimes.pydantic_ai._tools import ToolLoopExhaustedError
from atmosphere.sdk import StreamingSession

MAX_PROVIDER_MESSAGE = 500


class StructuredOutputInvalidError(Exception):
    """No answer validated against the requested model within the retry budget."""

    code = catalogue.StructuredOutputInvalidError.code

    def __init__(self, attempts: int, problems: str) -> None:
        """The built-in runtime's words for `attempts` failed attempts."""
        super().__init__(f"structured output did not match schema after {attempts} attempt(s): {problems}")


@dataclass(frozen=True, slots=True)
class Failure:
    """The error a run ends with."""

    message: str
    code: str
    retryable: bool = False


def failure_of(exc: BaseException) -> Failure | None:
    """The error for `exc`, or None when it is not this runtime's to describe."""
    if isinstance(exc, ToolLoopExhaustedError | StructuredOutputInvalidError):
        return Failure(str(exc), exc.code)
    if isinstance(exc, ModelHTTPError):
        return http_failure(exc.status_code, exc.body)
    if isinstance(exc, AgentRunError):
        return _framework_failure(exc)
    return None


def _framework_failure(exc: AgentRunError) -> Failure:
    """A failure PydanticAI reported without an HTTP status: the connection, the answer, the run."""
    if isinstance(exc, ModelTimeoutError):
        return Failure("the model provider did not answer in time", ProviderTimeoutError.code, retryable=True)
    if isinstance(exc, ModelAPIError):
        return Failure(f"provider call failed ({exc.message})", ProviderUnavailableError.code, retryable=True)
    if isinstance(exc, UnexpectedModelBehavior):
        return Failure(f"the model provider's answer was unusable: {exc.message}", ProviderMalformedError.code)
    return Failure(exc.message, RuntimeFailedError.code)


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


def validation_problems(exc: BaseException) -> str:
    """What was wrong with an answer, in the built-in runtime's `field: problem` form when pydantic said."""
    if isinstance(exc, pydantic.ValidationError):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors()[:10])
    return str(exc)


async def emit_entity(session: StreamingSession, entity: BaseModel, text: str) -> None:
    """Send a validated structured answer as the built-in runtime does: the entity's events, then its text."""
    model = type(entity)
    type_name = model.__name__
    schema = json.dumps(model.model_json_schema())
    await session.emit(RunEvent(entity_start=EntityStart(type_name=type_name, json_schema=schema)))
    for name, value in entity.model_dump(mode="json").items():
        field = StructuredField(field_name=name, value_json=json.dumps(value), schema_type=type_name)
        await session.emit(RunEvent(structured_field=field))
    complete = EntityComplete(type_name=type_name, entity_json=entity.model_dump_json())
    await session.emit(RunEvent(entity_complete=complete))
    await session.send(text)
