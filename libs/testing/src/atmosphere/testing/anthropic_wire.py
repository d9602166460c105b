"""The scripted model on Anthropic's wire: `POST …/v1/messages` and `GET …/v1/models`.

How a request reads (`request_of`) and how a `Turn` is spelled: a server-sent-event stream of
Anthropic's named events (`stream_payloads`) — `message_start` (the input and prompt-cache
tokens), a `ping`, for each content block `content_block_start`, its `content_block_delta`s
(`text_delta`s, or a `tool_use`'s input in `input_json_delta` fragments) and
`content_block_stop`, then `message_delta` (the stop reason and the output tokens) and
`message_stop`; a `message` when the request does not stream (`message`); an error in
Anthropic's JSON shape, with its status and `retry-after` header (`error_body`). The same `Turn`s
script this wire and OpenAI's (`atmosphere.testing.openai_wire`).

Anthropic's SDK reads an event by its `event:` name (an event without one is skipped), so every
payload here is a whole event: its name line and its data line.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from atmosphere.testing.model_stream import STALL, Answer, Paced
from atmosphere.testing.model_turns import ModelRequest, ToolCallScript, Turn

VERSION_HEADER = "anthropic-version"
"""Sent by every Anthropic client: what tells `GET …/models` on this wire from OpenAI's."""
MESSAGE_ID = "msg_fake"
REQUEST_ID = "req_fake"
SSE_HEADERS = (("content-type", "text/event-stream"), ("cache-control", "no-cache"))
STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens", "content_filter": "refusal"}
"""`Turn.finish_reason` (OpenAI's words) in Anthropic's; any other word is sent as it is."""
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
"""The `error.type` Anthropic sends with each status."""
MODELS_CREATED_AT = "2025-01-01T00:00:00Z"


def claims(method: str, path: str, headers: Mapping[str, str]) -> bool:
    """Whether a request is on this wire: a message, or any request of an Anthropic client."""
    return is_messages(method, path) or any(name.lower() == VERSION_HEADER for name in headers)


def is_messages(method: str, path: str) -> bool:
    """The route of a message (Anthropic's model call)."""
    return method == "POST" and path.endswith("/v1/messages")


is_call = is_messages


def is_models(method: str, path: str) -> bool:
    """The route listing the models."""
    return method == "GET" and path.endswith("/v1/models")


def request_of(body: Mapping[str, Any], headers: Mapping[str, str]) -> ModelRequest:
    """What a messages request asks, for the script."""
    tools = tuple(str(t.get("name", "")) for t in body.get("tools", ()) if isinstance(t, Mapping))
    return ModelRequest(messages=tuple(body.get("messages", ())), tools=tools, body=body, headers=headers)


def answer(turn: Turn, body: Mapping[str, Any], _path: str = "") -> Answer:
    """`turn` as the answer to the messages request `body` (its `stream` says whether to stream)."""
    if turn.failed:
        retry = (("retry-after", turn.retry_after),) if turn.retry_after else ()
        return Answer(turn.status, json=error_body(turn), headers=retry, silence=turn.silence)
    if not body.get("stream"):
        return Answer(200, json=message(turn, body), silence=turn.silence)
    stream = Paced(turn, stream_payloads(turn, body), _encoder(turn))
    return Answer(200, stream=stream, headers=SSE_HEADERS, silence=turn.silence)


def models(names: tuple[str, ...]) -> Answer:
    """The answer of `GET /v1/models`: one page, Anthropic's list shape."""
    data = [
        {"type": "model", "id": m, "display_name": m, "created_at": MODELS_CREATED_AT, "lifecycle": "active"}
        for m in names
    ]
    first, last = (names[0], names[-1]) if names else (None, None)
    return Answer(200, json={"data": data, "has_more": False, "first_id": first, "last_id": last})


def failure(status: int, message: str, error_type: str = "") -> Answer:
    """An error the fake itself answers (a refused request, a broken script).

    Its type is the status's (`ERROR_TYPES`) unless given.
    """
    kind = error_type or ERROR_TYPES.get(status, "api_error")
    return Answer(status, json=error_body(Turn(status=status, error_message=message, error_type=kind)))


def error_body(turn: Turn) -> dict[str, Any]:
    """`turn`'s error in Anthropic's JSON shape (`error.details.error_code` when it has a code)."""
    error: dict[str, Any] = {"type": error_type(turn), "message": turn.error_message}
    if turn.error_code:
        error["details"] = {"error_code": turn.error_code}
    return {"type": "error", "error": error, "request_id": REQUEST_ID}


def error_type(turn: Turn) -> str:
    """The scripted `error_type` when it is one of Anthropic's, else the one its status implies."""
    if turn.error_type in ERROR_TYPES.values():
        return turn.error_type
    status = turn.status
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


def stop_reason(turn: Turn) -> str:
    """Why the answer ends, in Anthropic's words."""
    reason = turn.finish_reason or ("tool_calls" if turn.calls else "stop")
    return STOP_REASONS.get(reason, reason)


def stream_payloads(turn: Turn, request: Mapping[str, Any]) -> list[str]:
    """The events of `turn`'s stream for `request` (`STALL` marks a pause)."""
    if turn.shape == "stream_error":
        return [_event("error", error_body(turn))]
    if turn.shape == "raw":
        return [_raw_event(payload) for payload in turn.chunks]
    start = _event("message_start", {"type": "message_start", "message": _message_head(turn, request)})
    if turn.shape == "empty":
        return [start, _event("message_stop", {"type": "message_stop"})]
    events = [start, _event("ping", {"type": "ping"})]
    index = 0
    if turn.pieces or turn.shape == "malformed":
        events.append(_block_start(index, {"type": "text", "text": ""}))
        events += [_delta(index, {"type": "text_delta", "text": piece}) for piece in turn.pieces]
        if turn.shape == "malformed":
            return [*events, "event: content_block_delta\ndata: {not json"]
        if turn.stall:
            events.append(STALL)
        events.append(_event("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    elif turn.stall:
        events.append(STALL)
    for number, call in enumerate(turn.calls):
        events += _tool_use_events(turn, index + number, _call_id(call, number), call)
    if not turn.finish:
        return events
    delta = {"stop_reason": stop_reason(turn), "stop_sequence": _stop_sequence(turn, request)}
    output = turn.usage[1] if turn.usage else 0
    events.append(
        _event("message_delta", {"type": "message_delta", "delta": delta, "usage": {"output_tokens": output}})
    )
    return [*events, _event("message_stop", {"type": "message_stop"})]


def _tool_use_events(turn: Turn, index: int, call_id: str, call: ToolCallScript) -> list[str]:
    """A `tool_use` block: its start (an empty input), its input in pieces of `split_arguments`, its stop."""
    events = [_block_start(index, {"type": "tool_use", "id": call_id, "name": call.name, "input": {}})]
    arguments = call.arguments_json
    step = max(1, turn.split_arguments)
    for at in range(0, len(arguments), step):
        events.append(_delta(index, {"type": "input_json_delta", "partial_json": arguments[at : at + step]}))
    events.append(_event("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events


def message(turn: Turn, request: Mapping[str, Any]) -> dict[str, Any]:
    """`turn` as one `message` (a request that does not stream)."""
    content: list[dict[str, Any]] = [{"type": "text", "text": turn.content}] if turn.content else []
    for number, call in enumerate(turn.calls):
        block = {
            "type": "tool_use",
            "id": _call_id(call, number),
            "name": call.name,
            "input": _input(call.arguments_json),
        }
        content.append(block)
    head = _message_head(turn, request)
    head["usage"]["output_tokens"] = turn.usage[1] if turn.usage else 0
    return {
        **head,
        "content": content,
        "stop_reason": stop_reason(turn),
        "stop_sequence": _stop_sequence(turn, request),
    }


def _message_head(turn: Turn, request: Mapping[str, Any]) -> dict[str, Any]:
    """The message as `message_start` announces it: no content yet, the input tokens counted."""
    prompt, answered = turn.usage or (0, 0)
    usage: dict[str, Any] = {"input_tokens": prompt, "output_tokens": min(answered, 1)}
    if turn.cache_creation_tokens:
        usage["cache_creation_input_tokens"] = turn.cache_creation_tokens
    if turn.cache_read_tokens:
        usage["cache_read_input_tokens"] = turn.cache_read_tokens
    return {
        "id": MESSAGE_ID,
        "type": "message",
        "role": "assistant",
        "model": request.get("model", "fake-model"),
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }


def _stop_sequence(turn: Turn, request: Mapping[str, Any]) -> str | None:
    """The matched stop sequence of a `stop_sequence` stop: the request's first."""
    sequences = request.get("stop_sequences") or [None]
    return sequences[0] if stop_reason(turn) == "stop_sequence" else None


def _call_id(call: ToolCallScript, number: int) -> str:
    """The call's scripted id, else `toolu_<n>` (Anthropic's ids start so)."""
    return call.call_id or f"toolu_{number}"


def _input(arguments: str) -> Any:
    """A tool call's input object (`{}` when the scripted arguments are not a JSON object)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _block_start(index: int, block: dict[str, Any]) -> str:
    return _event("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})


def _delta(index: int, delta: dict[str, Any]) -> str:
    return _event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


def _event(name: str, data: Mapping[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(data)}"


def _raw_event(payload: str) -> str:
    """A scripted payload as an event, named by its `type` when it is a JSON object that has one."""
    try:
        data = json.loads(payload)
    except ValueError:
        data = None
    name = data.get("type") if isinstance(data, dict) else None
    return f"event: {name if isinstance(name, str) and name else 'unknown'}\ndata: {payload}"


def _encoder(turn: Turn) -> Callable[[str], bytes]:
    """How each event goes out, its text stamped at send time if asked."""

    def encode(payload: str) -> bytes:
        return f"{_stamped(payload) if turn.timestamps else payload}\n\n".encode()

    return encode


def _stamped(payload: str) -> str:
    """A `text_delta` event whose text is replaced by the send time in ns (for latency benches)."""
    name, _, data = payload.partition("\ndata: ")
    if name != "event: content_block_delta":
        return payload
    event = json.loads(data)
    if event.get("delta", {}).get("type") == "text_delta":
        event["delta"]["text"] = f"{time.time_ns()} "
    return f"{name}\ndata: {json.dumps(event)}"
