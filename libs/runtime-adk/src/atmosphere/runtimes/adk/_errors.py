"""How a run ends in failure: the platform's error codes, and what each exception of a run maps to.

The codes are the catalogue's (`atmosphere.bus.errors`), and the messages the built-in runtime's
(`API returned 429: <provider message>`, `Tool loop exhausted after N iterations`), so a client
sees the same run whichever runtime served it. An exception this module does not know (a
platform error raised by the choke point, a bug) propagates to dispatch, which ends the run.
"""

from __future__ import annotations

import math

from atmosphere.bus.errors import (
    ProviderError,
    ProviderMalformedError,
    ProviderRateLimitedError,
    ProviderRejectedError,
    ProviderTimeoutError,
    ProviderUnavailableError,
    ToolLoopExhaustedError,
)
from atmosphere.contracts.common.v1.common_pb2 import Error
from atmosphere.contracts.run.v1.run_pb2 import RunEvent

PROVIDER_ERROR = ProviderError.code
PROVIDER_REJECTED = ProviderRejectedError.code
PROVIDER_RATE_LIMITED = ProviderRateLimitedError.code
PROVIDER_UNAVAILABLE = ProviderUnavailableError.code
PROVIDER_TIMEOUT = ProviderTimeoutError.code
PROVIDER_MALFORMED = ProviderMalformedError.code
TOOL_LOOP_EXHAUSTED = ToolLoopExhaustedError.code

TOOL_LIMIT_REACHED = "Error: the tool-call limit for this request was reached; answer with what you have"
"""What the model reads for a call past a lenient tool loop's cap (dispatch's wording)."""
NO_TOOL_RUNNER = "Error: no tool runner is attached to this run"
"""The built-in runtime's text for a tool call on a run that cannot run tools."""
MAX_PROVIDER_MESSAGE = 500


class RunFailedError(Exception):
    """The run ends with this error: a catalogue `code` and a message safe to show to the client.

    `status` is the provider's HTTP status when it answered with one; `details` travel in the
    error event (ingress maps `status` and `retry_after` to HTTP).
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        retryable: bool = False,
        status: int | None = None,
        provider_code: str = "",
        retry_after: float | None = None,
    ) -> None:
        """Fail with `code` and `message`."""
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable
        self.status = status
        self.provider_code = provider_code
        self.retry_after = retry_after

    def details(self) -> dict[str, str]:
        """The error event's `details`."""
        details: dict[str, str] = {}
        if self.status is not None:
            details["status"] = str(self.status)
        if self.provider_code:
            details["provider_code"] = self.provider_code
        if self.retry_after is not None:
            details["retry_after"] = str(math.ceil(self.retry_after))
        return details

    def to_event(self) -> RunEvent:
        """The run's error terminal."""
        error = Error(code=self.code, message=self.message, retryable=self.retryable, details=self.details())
        return RunEvent(error=error)


class ToolLoopExhaustedRunError(RunFailedError):
    """A strict tool loop's cap was reached and the model still asked for tools."""

    def __init__(self, cap: int) -> None:
        """The built-in runtime's words for a strict cap of `cap` rounds."""
        super().__init__(TOOL_LOOP_EXHAUSTED, f"Tool loop exhausted after {cap} iterations")


def bounded(text: str, limit: int = MAX_PROVIDER_MESSAGE) -> str:
    """A provider's words, cut to `limit` characters."""
    return text[:limit].strip()
