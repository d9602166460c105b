"""How a run ends in failure: the platform's error codes, and the exception that carries one.

The codes are the catalogue's (`atmosphere.bus.errors`): ingress maps them to HTTP statuses exactly
as for the built-in runtime.
"""

from __future__ import annotations

from atmosphere.bus.errors import (
    ProviderEmptyAnswerError,
    ProviderError,
    ProviderMalformedError,
    ProviderMisconfiguredError,
    ProviderRateLimitedError,
    ProviderRejectedError,
    ProviderTimeoutError,
    ProviderTooLargeError,
    ProviderUnavailableError,
    StructuredOutputInvalidError,
    ToolLoopExhaustedError,
)

PROVIDER_ERROR = ProviderError.code
PROVIDER_REJECTED = ProviderRejectedError.code
PROVIDER_RATE_LIMITED = ProviderRateLimitedError.code
PROVIDER_UNAVAILABLE = ProviderUnavailableError.code
PROVIDER_MISCONFIGURED = ProviderMisconfiguredError.code
PROVIDER_TIMEOUT = ProviderTimeoutError.code
PROVIDER_MALFORMED = ProviderMalformedError.code
PROVIDER_EMPTY_ANSWER = ProviderEmptyAnswerError.code
PROVIDER_TOO_LARGE = ProviderTooLargeError.code
TOOL_LOOP_EXHAUSTED = ToolLoopExhaustedError.code
STRUCTURED_OUTPUT_INVALID = StructuredOutputInvalidError.code
