"""The model provider's own error codes that dispatch reads (OpenAI's wire, not ours).

Dispatch's own codes are classes of the catalogue (`atmosphere.bus.errors`); these are what an
OpenAI-compatible provider says in `error.code`/`error.type`, which decide how its failure is
reported. (`insufficient_quota`, a 429 that is not a rate limit, is read by every runtime:
`atmosphere.bus.errors.OUT_OF_CREDIT`.)
"""

from __future__ import annotations

CONTEXT_OVERFLOW = "context_length_exceeded"
"""The prompt does not fit the model's context window (a 400 that no retry fixes)."""
