"""The local model server's own errors: OpenAI's error shape and codes, as a provider answers.

`atmosphere dev`'s model server is a stand-in provider, not ingress: its codes are OpenAI's
(`context_length_exceeded`, ...) and travel in an HTTP body to whoever calls it, never on the
bus, so they are not `ServiceError`s of the catalogue in `atmosphere.bus.errors`.
"""

from __future__ import annotations

from typing import Any, ClassVar

PAYLOAD_TOO_LARGE = "payload_too_large"
"""OpenAI's code for a request body over the server's limit (HTTP 413)."""
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
"""OpenAI's code for a prompt longer than the model's context window (HTTP 400)."""


class RequestError(ValueError):
    """A request this server refuses, with the HTTP status and OpenAI error fields to say so."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param

    def body(self) -> dict[str, Any]:
        """OpenAI's error shape."""
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


class PayloadTooLargeError(RequestError):
    """The request body is larger than the server reads."""

    status_code: ClassVar[int] = 413

    def __init__(self, message: str) -> None:
        super().__init__(self.status_code, message, code=PAYLOAD_TOO_LARGE)


class ContextLengthExceededError(RequestError):
    """The messages do not fit the model's context window."""

    status_code: ClassVar[int] = 400

    def __init__(self, message: str) -> None:
        super().__init__(self.status_code, message, code=CONTEXT_LENGTH_EXCEEDED, param="messages")
