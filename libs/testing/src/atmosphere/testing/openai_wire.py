"""The scripted model on OpenAI's wire: `POST …/chat/completions` and `GET …/models`.

How a request reads (`request_of`) and how a `Turn` is spelled: a server-sent-event stream of
`chat.completion.chunk`s ending with `[DONE]` (`stream_payloads`), a `chat.completion` when the
request does not stream (`completion`), an error in OpenAI's JSON shape (`error_body`). The one
encoding of a scripted answer, over loopback HTTP and in memory alike.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from atmosphere.testing.model_stream import STALL, Answer, Paced
from atmosphere.testing.model_turns import ModelRequest, Turn

DONE = "[DONE]"
SSE_HEADERS = (("content-type", "text/event-stream"), ("cache-control", "no-cache"))


def is_completions(method: str, path: str) -> bool:
    """The route of a chat completion."""
    return method == "POST" and path.endswith("/chat/completions")


def is_models(method: str, path: str) -> bool:
    """The route listing the models."""
    return method == "GET" and path.endswith("/models")


def request_of(body: Mapping[str, Any], headers: Mapping[str, str]) -> ModelRequest:
    """What a chat-completions request asks, for the script."""
    tools = tuple(str(t.get("function", {}).get("name", "")) for t in body.get("tools", ()))
    return ModelRequest(messages=tuple(body.get("messages", ())), tools=tools, body=body, headers=headers)


def answer(turn: Turn, body: Mapping[str, Any]) -> Answer:
    """`turn` as the answer to the chat-completions request `body`."""
    if turn.failed:
        retry = (("retry-after", turn.retry_after),) if turn.retry_after else ()
        return Answer(turn.status, json=error_body(turn), headers=retry, silence=turn.silence)
    if not body.get("stream"):
        return Answer(200, json=completion(turn, body), silence=turn.silence)
    stream = Paced(turn, stream_payloads(turn, body), _encoder(turn))
    return Answer(200, stream=stream, headers=SSE_HEADERS, silence=turn.silence)


def models(names: tuple[str, ...]) -> Answer:
    """The answer of `GET /models`."""
    return Answer(
        200, json={"object": "list", "data": [{"id": m, "object": "model", "owned_by": "fake"} for m in names]}
    )


def failure(status: int, message: str, error_type: str = "scripted") -> Answer:
    """An error the fake itself answers (no route, a refused request, a broken script)."""
    return Answer(status, json=error_body(Turn(status=status, error_message=message, error_type=error_type)))


def error_body(turn: Turn) -> dict[str, Any]:
    """`turn`'s error in OpenAI's JSON shape."""
    return {
        "error": {
            "message": turn.error_message,
            "type": turn.error_type,
            "param": turn.error_param,
            "code": turn.error_code,
        }
    }


def stream_payloads(turn: Turn, request: Mapping[str, Any]) -> list[str]:
    """The `data:` payloads of `turn`'s stream for `request`, `[DONE]` last (`STALL` marks a pause)."""
    if turn.shape == "empty":
        return [DONE]
    if turn.shape == "stream_error":
        return [json.dumps(error_body(turn))]
    if turn.shape == "raw":
        return [*turn.chunks, DONE]
    events = [_chunk(request, {"role": "assistant", "content": ""})]
    events += [_chunk(request, {"content": piece}) for piece in turn.pieces]
    if turn.shape == "malformed":
        return [*events, "{not json"]
    if turn.stall:
        events.append(STALL)
    events += _tool_call_chunks(turn, request)
    if not turn.finish:
        return events
    events.append(_chunk(request, {}, _finish_reason(turn)))
    usage = _usage(turn, request)
    if usage:
        events.append(usage)
    return [*events, DONE]


def _tool_call_chunks(turn: Turn, request: Mapping[str, Any]) -> list[str]:
    """Each call's name, then its arguments in pieces of `split_arguments` characters."""
    events: list[str] = []
    for index, call in enumerate(turn.calls):
        arguments = call.arguments_json
        call_id = call.call_id or f"call_{index}"
        first = {"index": index, "id": call_id, "type": "function", "function": {"name": call.name, "arguments": ""}}
        events.append(_chunk(request, {"tool_calls": [first]}))
        step = max(1, turn.split_arguments)
        for start in range(0, len(arguments), step):
            piece = {"index": index, "function": {"arguments": arguments[start : start + step]}}
            events.append(_chunk(request, {"tool_calls": [piece]}))
    return events


def completion(turn: Turn, request: Mapping[str, Any]) -> dict[str, Any]:
    """`turn` as one `chat.completion` (a request that does not stream)."""
    message: dict[str, Any] = {"role": "assistant", "content": turn.content}
    if turn.calls:
        message["tool_calls"] = [
            {
                "id": call.call_id or f"call_{i}",
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments_json},
            }
            for i, call in enumerate(turn.calls)
        ]
    prompt, answered = turn.usage or (0, 0)
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": request.get("model", "fake-model"),
        "choices": [{"index": 0, "message": message, "finish_reason": _finish_reason(turn)}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": answered, "total_tokens": prompt + answered},
    }


def _finish_reason(turn: Turn) -> str:
    return turn.finish_reason or ("tool_calls" if turn.calls else "stop")


def _chunk(request: Mapping[str, Any], delta: dict[str, Any], finish: str | None = None) -> str:
    return json.dumps(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": request.get("model", "fake-model"),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


def _usage(turn: Turn, request: Mapping[str, Any]) -> str | None:
    """The choice-less usage chunk, only when the request asked for it (`stream_options.include_usage`)."""
    if turn.usage is None or not (request.get("stream_options") or {}).get("include_usage"):
        return None
    prompt, answered = turn.usage
    return json.dumps(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": answered, "total_tokens": prompt + answered},
        }
    )


def _encoder(turn: Turn) -> Callable[[str], bytes]:
    """How each payload goes out: an SSE `data:` event, its text stamped at send time if asked."""

    def encode(payload: str) -> bytes:
        return f"data: {_stamped(payload) if turn.timestamps else payload}\n\n".encode()

    return encode


def _stamped(payload: str) -> str:
    """A text chunk whose content is replaced by the send time in ns (for latency benches)."""
    if not payload.startswith("{"):
        return payload
    chunk = json.loads(payload)
    for choice in chunk.get("choices", []):
        if choice.get("delta", {}).get("content"):
            choice["delta"]["content"] = f"{time.time_ns()} "
    return json.dumps(chunk)
