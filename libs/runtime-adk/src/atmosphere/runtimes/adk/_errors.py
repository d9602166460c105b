"""How a run ends in failure: the platform's error codes, and what each exception of a run maps to.

The codes are the catalogue's (`atmosphere.bus.errors`), and the messages the built-in runtime's
(`API returned 429: <provider message>`, `Tool loop exhausted after N iterations`), so a client
sees the same run whichever runtime served it. An exception this module does not know (a
platform error raised by the choke point, a bug) propagates to dispatch, which ends the run.
"""

from __future__ import annotations

from atmosphere.bus.errors import (
    ProviderError,
    ProviderMalformedError,
    ProviderRateLimitedError,
    ProviderRejectedError,
    ProviderTimeoutError,
    ProviderUnavailableError,
    ToolLoopExhaustedError,
)
from atmosphere.sdk.runtime_errors import RunFailedError

PROVIDER_ERROR = ProviderError.code
PROVIDER_REJECTED = ProviderRejectedError.code
PROVIDER_RATE_LIMITED = ProviderRateLimitedError.code
PROVIDER_UNAVAILABLE = ProviderUnavailableError.code
PROVIDER_TIMEOUT = ProviderTimeoutError.code
PROVIDER_MALFORMED = ProviderMalformedError.code
TOOL_LOOP_EXHAUSTED = ToolLoopExhaustedError.code

MAX_PROVIDER_MESSAGE = 500


class ToolLoopExhaustedRunError(RunFailedError):
    """A strict tool loop's cap was reached and the model still asked for tools."""

    def __init__(self, cap: int) -> None:
        """The built-in runtime's words for a strict cap of `cap` rounds."""
        super().__init__(TOOL_LOOP_EXHAUSTED, f"Tool loop exhausted after {cap} iterations")


def bounded(text: str, limit: int = MAX_PROVIDER_MESSAGE) -> str:
    """A provider's words, cut to `limit` characters."""
    return text[:limit].strip()
