"""The OpenAI chat-completions wire: validating requests, mapping models, shaping answers.

Atmosphere's rules (reference §10): anything we cannot honour exactly is refused with
`unsupported_parameter` rather than half-supported; prior turns travel with the request;
sampling parameters are accepted and ignored (the agent's configuration decides).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_BODY_CHARS = 1_048_576
UNSUPPORTED_FIELDS = ("tools", "tool_choice", "functions", "function_call")


class OpenAiError(Exception):
    """An error answered in OpenAI's JSON shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        super().__init__(message)

    def body(self) -> dict[str, Any]:
        """`{"error": {"message", "type", "param", "code"}}`."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def unsupported(param: str, what: str) -> OpenAiError:
    """A 400 `unsupported_parameter` error."""
    return OpenAiError(400, f"{what} is not supported by this server.", param=param, code="unsupported_parameter")


@dataclass(frozen=True)
class ChatRequest:
    """A validated chat-completions request."""

    model: str | None
    prompt: str
    """The last user message."""
    prior: list[dict[str, str]] = field(default_factory=list)
    """Earlier turns as `{role, content}` (client system messages included, as history)."""
    stream: bool = False
    user: str | None = None


def _text(content: Any, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise unsupported("messages", f"messages[{index}]: a content part that is not text")
            parts.append(part["text"])
        return "".join(parts)
    raise OpenAiError(
        400, f"messages[{index}].content must be a string, null or a list of text parts.", param="messages"
    )


def _messages(raw: Any) -> list[dict[str, str]]:
    if not isinstance(raw, list) or not raw:
        raise OpenAiError(400, "'messages' must be a non-empty array.", param="messages")
    messages = []
    for index, message in enumerate(raw):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise OpenAiError(400, f"messages[{index}] must be an object with a string 'role'.", param="messages")
        if message.get("tool_calls"):
            raise unsupported("messages", f"messages[{index}].tool_calls")
        role = message["role"]
        if role == "tool":
            raise unsupported("messages", "A 'tool' role message")
        if role == "developer":
            role = "system"
        if role not in {"system", "user", "assistant"}:
            raise OpenAiError(400, f"messages[{index}].role '{role}' is not valid.", param="messages")
        messages.append({"role": role, "content": _text(message.get("content"), index)})
    return messages


def parse_chat_request(raw: bytes) -> ChatRequest:
    """Validate a request body; `OpenAiError` for anything not acceptable."""
    if not raw:
        raise OpenAiError(400, "Request body is empty.")
    text = raw.decode("utf-8", errors="replace")
    if len(text) > MAX_BODY_CHARS:
        raise OpenAiError(413, f"Request body exceeds {MAX_BODY_CHARS} characters.", code="payload_too_large")
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        raise OpenAiError(400, "Invalid JSON payload.") from None
    if not isinstance(body, dict):
        raise OpenAiError(400, "Request body must be a JSON object.")
    for name in UNSUPPORTED_FIELDS:
        value = body.get(name)
        if value is not None and value not in ([], ""):
            raise unsupported(name, f"'{name}'")
    n = body.get("n")
    if isinstance(n, int | float) and not isinstance(n, bool) and n != 1:
        raise unsupported("n", "'n' other than 1")
    response_format = body.get("response_format")
    if response_format is not None and (not isinstance(response_format, dict) or response_format.get("type") != "text"):
        raise unsupported("response_format", "A 'response_format' other than text")
    for name in ("model", "user"):
        if name in body and body[name] is not None and not isinstance(body[name], str):
            raise OpenAiError(400, f"'{name}' must be a string.", param=name)
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise OpenAiError(400, "'stream' must be a boolean.", param="stream")
    messages = _messages(body.get("messages"))
    last = messages[-1]
    if last["role"] != "user" or not last["content"].strip():
        raise OpenAiError(400, "The last message must be a user message with content.", param="messages")
    model = (body.get("model") or "").strip() or None
    user = (body.get("user") or "").strip() or None
    return ChatRequest(model=model, prompt=last["content"], prior=messages[:-1], stream=bool(stream), user=user)


def resolve_target(
    model: str | None, *, models: Mapping[str, str], default_agent: str, registered: Sequence[str]
) -> str:
    """The agent serving `model`.

    A non-empty `models` map is a whitelist (mapped names, else the default agent); without it
    a model is served by the agent of that name, else by the default agent.
    """
    if model is None:
        if default_agent:
            return default_agent
        raise OpenAiError(400, "'model' is required.", param="model")
    if models:
        target = models.get(model) or default_agent
    else:
        target = model if model in registered else default_agent
    if not target:
        raise OpenAiError(
            404,
            f"The model '{model}' does not exist or is not exposed by this server.",
            param="model",
            code="model_not_found",
        )
    if target not in registered:
        raise OpenAiError(
            503,
            f"The agent behind '{model}' is not available right now.",
            type_="server_error",
            code="service_unavailable",
        )
    return target


def model_list(models: Mapping[str, str], registered: Sequence[str]) -> dict[str, Any]:
    """The `/models` answer: mapped names when a map is set, else every agent."""
    created = int(time.time())
    names = sorted(models) if models else sorted(registered)
    return {
        "object": "list",
        "data": [{"id": n, "object": "model", "created": created, "owned_by": "atmosphere"} for n in names],
    }


def error_for_run(code: str, message: str) -> OpenAiError:
    """The HTTP error for a run that ended in an error before any text was sent."""
    if code == "budget.exceeded":
        return OpenAiError(429, message, type_="rate_limit_error", code="budget_exceeded")
    if code == "governance.denied":
        return OpenAiError(403, message, code="request_blocked")
    if code.endswith(".unavailable"):
        return OpenAiError(
            503, "The agent is unavailable right now; try again.", type_="server_error", code="service_unavailable"
        )
    return OpenAiError(500, "The agent failed to complete the request.", type_="server_error")


@dataclass
class Completion:
    """Identity of one completion, shared by its chunks."""

    model: str
    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        """A `chat.completion.chunk`."""
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        """The last chunk before `[DONE]` when token counts are known."""
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage,
        }

    def complete(self, content: str, usage: dict[str, int] | None) -> dict[str, Any]:
        """A non-streamed `chat.completion`."""
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        }
        if usage:
            body["usage"] = usage
        return body


def sse_data(value: dict[str, Any] | str) -> bytes:
    """One `data:` frame."""
    payload = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()
