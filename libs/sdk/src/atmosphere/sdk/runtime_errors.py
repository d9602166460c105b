"""How a runtime ends a run in failure, and what the model reads when a tool call cannot run.

`RunFailedError` carries the catalogue's code; the texts are dispatch's wording.

The codes are the catalogue's (`atmosphere.bus.errors`): ingress maps them to HTTP statuses as for
the built-in runtime. One owner for the native adapters (Anthropic, Cohere, ADK), which end a run
by emitting `RunFailedError.to_event()`.
"""

from __future__ import annotations

import math

from atmosphere.contracts.common.v1.common_pb2 import Error
from atmosphere.contracts.run.v1.run_pb2 import RunEvent

TOOL_LIMIT_REACHED = "Error: the tool-call limit for this request was reached; answer with what you have"
"""What the model reads for the calls it asked for past the tool-loop cap (dispatch's wording)."""
NO_TOOL_RUNNER = "Error: no tool runner is attached to this run"
"""The built-in runtime's text for a tool call on a run that cannot run tools."""


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
