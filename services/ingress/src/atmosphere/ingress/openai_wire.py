"""The OpenAI chat-completions wire: validating requests, mapping models, shaping answers.

Atmosphere's rules (reference §10): anything we cannot honour exactly is refused with
`unsupported_parameter` rather than half-supported; prior turns travel with the request;
sampling parameters are accepted (when well-typed) and ignored (the agent's configuration
decides).

Errors say whether retrying helps, in the way OpenAI's clients read it (`errors.OpenAiError`):
a 5xx (or 429) comes with `Retry-After` only when a later retry can succeed; every other error
that a client would retry by default carries `x-should-retry: false`, so the official client
does not multiply runs that cannot succeed. A run's error is mapped by its catalogue class.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from atmosphere.bus.errors import (
    BudgetExceededError,
    GovernanceDeniedError,
    ProviderMisconfiguredError,
    ProviderRateLimitedError,
    ProviderRejectedError,
    RuntimeUnavailableError,
    ServiceError,
)
from atmosphere.contracts.common.v1.common_pb2 import Error
from atmosphere.contracts.run.v1.run_pb2 import ToolStart
from atmosphere.ingress.bodies import BodyError, parse_json
from atmosphere.ingress.client_functions import (
    Gateway,
    chat_function,
    functions_of,
    response_format_of,
    split_exchange,
    tool_choice_of,
)
from atmosphere.ingress.errors import (
    DEFAULT_RETRY_AFTER,
    BodyTooLargeError,
    OpenAiBadGatewayError,
    OpenAiBudgetExceededError,
    OpenAiError,
    OpenAiInvalidRequestError,
    OpenAiModelNotFoundError,
    OpenAiProviderRefusalError,
    OpenAiRateLimitedError,
    OpenAiRequestBlockedError,
    OpenAiServerError,
    OpenAiTooLargeError,
    OpenAiUnavailableError,
    OpenAiUnsupportedParameterError,
    is_provider_failure,
    is_unavailable,
)

MAX_BODY_CHARS = 1_048_576
MAX_MODEL_CHARS = 256
"""Longest `model` (and `user`) accepted; model ids are short names."""
MAX_MESSAGES = 1024
UNSUPPORTED_FIELDS = ("functions", "function_call")
"""The deprecated spelling of `tools`: clients that still send it are told to send `tools`."""
MAX_RETRY_AFTER = 3600


def body_error(exc: BodyError) -> OpenAiError:
    """A body that could not be read (too large, not UTF-8, cut off) in OpenAI's shape."""
    if isinstance(exc, BodyTooLargeError):
        return OpenAiTooLargeError(exc.message + ".")
    return OpenAiInvalidRequestError(exc.message + ".")


def unsupported(param: str, what: str) -> OpenAiError:
    """A 400 `unsupported_parameter` error."""
    return OpenAiUnsupportedParameterError(f"{what} is not supported by this server.", param=param)


def agent_failed() -> OpenAiError:
    """The 500 of an agent that failed: what went wrong stays in the log."""
    return OpenAiServerError("The agent failed to complete the request.")


@dataclass(frozen=True)
class ChatRequest:
    """A validated chat-completions request."""

    model: str | None
    prompt: str
    """The last user message."""
    prior: list[dict[str, Any]] = field(default_factory=list)
    """Earlier turns as `{role, content}` (client system messages included, as history; an
    assistant turn's `tool_calls` and a `tool` turn's `tool_call_id` too)."""
    gateway: Gateway = field(default_factory=Gateway)
    """The client's own functions, tool choice, answer format, and the exchange after `prompt`."""
    stream: bool = False
    include_usage: bool = False
    """`stream_options.include_usage`: end the stream with a usage chunk (`choices: []`)."""
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
    raise OpenAiInvalidRequestError(
        f"messages[{index}].content must be a string, null or a list of text parts.", param="messages"
    )


def _messages(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise OpenAiInvalidRequestError("'messages' must be a non-empty array.", param="messages")
    if len(raw) > MAX_MESSAGES:
        raise OpenAiInvalidRequestError(f"'messages' may hold at most {MAX_MESSAGES} messages.", param="messages")
    messages: list[dict[str, Any]] = []
    calls: set[str] = set()
    for index, message in enumerate(raw):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise OpenAiInvalidRequestError(
                f"messages[{index}] must be an object with a string 'role'.", param="messages"
            )
        role = message["role"]
        if role == "developer":
            role = "system"
        if role not in {"system", "user", "assistant", "tool"}:
            raise OpenAiInvalidRequestError(f"messages[{index}].role '{role}' is not valid.", param="messages")
        turn: dict[str, Any] = {"role": role, "content": _text(message.get("content"), index)}
        if message.get("tool_calls"):
            if role != "assistant":
                raise OpenAiInvalidRequestError(
                    f"messages[{index}]: only an assistant makes tool_calls.", param="messages"
                )
            turn["tool_calls"] = _tool_calls(message["tool_calls"], index)
            calls.update(c["id"] for c in turn["tool_calls"])
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or call_id not in calls:
                raise OpenAiInvalidRequestError(
                    f"messages[{index}]: a 'tool' message must answer an earlier assistant's tool call "
                    "by its 'tool_call_id'.",
                    param="messages",
                )
            turn["tool_call_id"] = call_id
        messages.append(turn)
    return messages


def _tool_calls(raw: Any, index: int) -> list[dict[str, str]]:
    """An assistant turn's `tool_calls`, as `{id, name, arguments}`."""
    where = f"messages[{index}].tool_calls"
    if not isinstance(raw, list):
        raise OpenAiInvalidRequestError(f"{where} must be an array.", param="messages")
    calls = []
    for position, call in enumerate(raw):
        function = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(function, dict)
            or not isinstance(call.get("id"), str)
            or not call["id"]
            or call.get("type", "function") != "function"
            or not isinstance(function.get("name"), str)
            or not isinstance(function.get("arguments", ""), str)
        ):
            raise OpenAiInvalidRequestError(
                f"{where}[{position}] must be {{id, type: 'function', function: {{name, arguments}}}}.",
                param="messages",
            )
        calls.append({"id": call["id"], "name": function["name"], "arguments": function.get("arguments") or "{}"})
    return calls


def json_body(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise OpenAiInvalidRequestError("Request body is empty.")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise OpenAiInvalidRequestError("Request body must be UTF-8 text.") from None
    if len(text) > MAX_BODY_CHARS:
        raise OpenAiTooLargeError(f"Request body exceeds {MAX_BODY_CHARS} characters.")
    try:
        # Total: deep nesting, 5,000-digit numbers, NaN and lone surrogates are all a 400.
        body = parse_json(text)
    except BodyError as exc:
        raise OpenAiInvalidRequestError(f"Invalid JSON payload ({exc.message}).") from None
    if not isinstance(body, dict):
        raise OpenAiInvalidRequestError("Request body must be a JSON object.")
    return body


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_sampling(body: dict[str, Any]) -> None:
    """Sampling parameters are ignored, but only when they are what OpenAI's API would accept."""
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        value = body.get(name)
        if value is not None and not _is_number(value):
            raise OpenAiInvalidRequestError(f"'{name}' must be a number.", param=name)
    for name in ("max_tokens", "max_completion_tokens", "n"):
        value = body.get(name)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool)):
            raise OpenAiInvalidRequestError(f"'{name}' must be an integer.", param=name)
    stop = body.get("stop")
    if (
        stop is not None
        and not isinstance(stop, str)
        and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise OpenAiInvalidRequestError("'stop' must be a string or a list of strings.", param="stop")


def _check_names(body: dict[str, Any]) -> None:
    for name in ("model", "user"):
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            raise OpenAiInvalidRequestError(f"'{name}' must be a string.", param=name)
        if len(value) > MAX_MODEL_CHARS:
            raise OpenAiInvalidRequestError(f"'{name}' is longer than {MAX_MODEL_CHARS} characters.", param=name)


def parse_chat_request(raw: bytes) -> ChatRequest:
    """Validate a request body; `OpenAiError` for anything not acceptable."""
    body = json_body(raw)
    for name in UNSUPPORTED_FIELDS:
        value = body.get(name)
        if value is not None and value not in ([], ""):
            raise unsupported(name, f"'{name}' (deprecated: send 'tools')")
    _check_sampling(body)
    n = body.get("n")
    if n is not None and n != 1:
        raise unsupported("n", "'n' other than 1")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise OpenAiInvalidRequestError("'parallel_tool_calls' must be a boolean.", param="parallel_tool_calls")
    functions = functions_of(body.get("tools"), chat_function)
    tool_choice = tool_choice_of(body.get("tool_choice"), functions, nested=True)
    response_format = response_format_of(body.get("response_format"))
    _check_names(body)
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise OpenAiInvalidRequestError("'stream' must be a boolean.", param="stream")
    include_usage = _include_usage(body.get("stream_options"))
    messages = _messages(body.get("messages"))
    asked, gateway = split_exchange(
        messages, functions=functions, tool_choice=tool_choice, response_format=response_format
    )
    continuation = gateway.continuation
    if asked is None or not messages[asked]["content"].strip() or (continuation and continuation[-1]["role"] != "tool"):
        raise OpenAiInvalidRequestError(
            "The last message must be a user message with content, or the results of the tool calls that followed it.",
            param="messages",
        )
    model = (body.get("model") or "").strip() or None
    user = (body.get("user") or "").strip() or None
    return ChatRequest(
        model=model,
        prompt=messages[asked]["content"],
        prior=messages[:asked],
        stream=bool(stream),
        include_usage=bool(stream) and include_usage,
        user=user,
        gateway=gateway,
    )


def _include_usage(options: Any) -> bool:
    """`stream_options.include_usage`; only a usage chunk the client asked for is sent.

    A chunk with empty `choices` breaks the common `chunk.choices[0]` loop of clients that
    did not ask for one.
    """
    if options is None:
        return False
    if not isinstance(options, dict):
        raise OpenAiInvalidRequestError("'stream_options' must be an object.", param="stream_options")
    include = options.get("include_usage")
    if include is not None and not isinstance(include, bool):
        raise OpenAiInvalidRequestError("'stream_options.include_usage' must be a boolean.", param="stream_options")
    return bool(include)


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
        raise OpenAiInvalidRequestError("'model' is required.", param="model")
    if models:
        target = models.get(model) or default_agent
    else:
        target = model if model in registered else default_agent
    if not target:
        raise OpenAiModelNotFoundError(
            f"The model '{model}' does not exist or is not exposed by this server.", param="model"
        )
    if target not in registered:
        raise OpenAiUnavailableError(f"The agent behind '{model}' is not available right now.")
    return target


def model_list(models: Mapping[str, str], registered: Sequence[str]) -> dict[str, Any]:
    """The `/models` answer: mapped names when a map is set, else every agent."""
    created = int(time.time())
    names = sorted(models) if models else sorted(registered)
    return {
        "object": "list",
        "data": [{"id": n, "object": "model", "created": created, "owned_by": "atmosphere"} for n in names],
    }


def error_for_run(error: Error) -> OpenAiError:
    """The HTTP error for a run that ended in `error` (its terminal event's), by the error's class."""
    failure = ServiceError.from_proto(error)
    if isinstance(failure, BudgetExceededError):
        return OpenAiBudgetExceededError(failure.message)
    if isinstance(failure, GovernanceDeniedError):
        return OpenAiRequestBlockedError(failure.message)
    if is_provider_failure(failure):
        return _provider_error(failure)
    if isinstance(failure, RuntimeUnavailableError):
        # No model is configured: the message names the setting, and retrying cannot help.
        return OpenAiUnavailableError(failure.message, retry_after=None)
    if failure.retryable or is_unavailable(failure):
        return OpenAiUnavailableError(
            "The agent is unavailable right now; try again.", retry_after=_retry_after(failure.details)
        )
    return agent_failed()


def _provider_error(failure: ServiceError) -> OpenAiError:
    """A model provider's failure, as close to what the provider itself said as is honest.

    Its 4xx is the client's 4xx (same status, the provider's reason and code); a rate limit is a
    429 and an outage a 503, each with `Retry-After`; a provider that answered nonsense (an
    empty or malformed answer) is a 502 that no retry is asked for.
    """
    message, details = failure.message, failure.details
    status = _status(details.get("status"))
    provider_code = details.get("provider_code") or None
    if isinstance(failure, ProviderRejectedError) and status in {401, 403}:
        # The provider refused the platform's own credentials (LLM_API_KEY), not the client's:
        # telling the client its key is wrong would send it looking in the wrong place.
        return OpenAiBadGatewayError(f"The model provider refused this server's credentials: {message}")
    if isinstance(failure, ProviderRejectedError) and status is not None and 400 <= status < 500:
        param = details.get("provider_param") or None
        return OpenAiProviderRefusalError(message, status=status, param=param, code=provider_code)
    if isinstance(failure, ProviderRateLimitedError):
        return OpenAiRateLimitedError(message, provider_code=provider_code, retry_after=_retry_after(details))
    if failure.retryable:
        return OpenAiUnavailableError(
            f"The model provider is unavailable: {message}", retry_after=_retry_after(details)
        )
    if isinstance(failure, ProviderMisconfiguredError):
        return agent_failed()
    return OpenAiBadGatewayError(f"The model provider failed: {message}")


def _status(raw: str | None) -> int | None:
    return int(raw) if raw and raw.isdigit() and 100 <= int(raw) <= 599 else None


def _retry_after(details: Mapping[str, str]) -> int:
    raw = details.get("retry_after", "")
    try:
        seconds = float(raw)
    except ValueError:
        return DEFAULT_RETRY_AFTER
    if not math.isfinite(seconds):
        return DEFAULT_RETRY_AFTER
    return min(MAX_RETRY_AFTER, max(1, math.ceil(seconds)))


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

    def complete(
        self,
        content: str,
        usage: dict[str, int] | None,
        finish_reason: str | None = "stop",
        tool_calls: Sequence[ToolStart] = (),
    ) -> dict[str, Any]:
        """A non-streamed `chat.completion` (with the calls handed back to the client, if any)."""
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["content"] = content or None
            message["tool_calls"] = [tool_call(call) for call in tool_calls]
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        }
        if usage:
            body["usage"] = usage
        return body


def tool_call(call: ToolStart, index: int | None = None) -> dict[str, Any]:
    """A call handed back to the client, in a message's `tool_calls` (or a chunk's, with its `index`)."""
    said: dict[str, Any] = {
        "id": call.call_id,
        "type": "function",
        "function": {"name": call.tool_name, "arguments": call.arguments_json},
    }
    return said if index is None else {"index": index, **said}


def sse_data(value: dict[str, Any] | str) -> bytes:
    """One `data:` frame."""
    payload = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()
