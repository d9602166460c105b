"""The scripted model on Cohere's v2 wire: `POST …/v2/chat` and `GET …/v1/models`.

How a request reads (`request_of`) and how a `Turn` is spelled: a server-sent-event stream of
Cohere's chat events (`stream_payloads`) — `message-start`; the answer's text as one content
block (`content-start`, its `content-delta`s, `content-end`), or, in a round that calls tools,
as the tool plan (`tool-plan-delta`s, Cohere's text before its calls); each tool call as
`tool-call-start` (its id and name), its arguments in `tool-call-delta` fragments and
`tool-call-end`; then `message-end` with the finish reason and the usage (`billed_units` and
`tokens`); a chat response when the request does not stream (`chat_response`); an error in
Cohere's JSON shape (`{"id", "message"}`), with its status and `retry-after` header
(`error_body`). The same `Turn`s script this wire and the others.

The `cohere` SDK reads an event by the `type` inside its data (the `event:` line, which the API
sends too, is not what it goes by) and skips an event whose data is not JSON. Cohere has no
finish reason for a provider's content filter: `content_filter` is sent as it is, as any word
`FINISH_REASONS` does not know (`ERROR`, `TIMEOUT`, `STOP_SEQUENCE` are Cohere's own).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from atmosphere.testing.model_stream import STALL, Answer, Paced
from atmosphere.testing.model_turns import ModelRequest, ToolCallScript, Turn

SDK_HEADER = "x-fern-sdk-name"
"""Sent by every request of Cohere's SDK (value `cohere`): what tells its `GET /v1/models` from
Anthropic's and OpenAI's."""
SDK_NAME = "cohere"
MESSAGE_ID = "msg_fake"
REQUEST_ID = "req_fake"
SSE_HEADERS = (("content-type", "text/event-stream"), ("cache-control", "no-cache"))
FINISH_REASONS = {"stop": "COMPLETE", "tool_calls": "TOOL_CALL", "length": "MAX_TOKENS"}
"""`Turn.finish_reason` (OpenAI's words) in Cohere's; any other word is sent as it is."""
CONTEXT_LENGTH = 128000


def claims(method: str, path: str, headers: Mapping[str, str]) -> bool:
    """Whether a request is on this wire: a chat, or any request of Cohere's SDK."""
    return is_call(method, path) or any(
        name.lower() == SDK_HEADER and value.lower() == SDK_NAME for name, value in headers.items()
    )


def is_call(method: str, path: str) -> bool:
    """The route of a chat (Cohere's model call)."""
    return method == "POST" and path.endswith("/v2/chat")


def is_models(method: str, path: str) -> bool:
    """The route listing the models (the SDK's `models.list` is on v1)."""
    return method == "GET" and path.endswith("/v1/models")


def request_of(body: Mapping[str, Any], headers: Mapping[str, str]) -> ModelRequest:
    """What a chat request asks, for the script."""
    tools = tuple(
        str((t.get("function") or {}).get("name", "")) for t in body.get("tools") or () if isinstance(t, Mapping)
    )
    return ModelRequest(messages=tuple(body.get("messages") or ()), tools=tools, body=body, headers=headers)


def answer(turn: Turn, body: Mapping[str, Any], _path: str = "") -> Answer:
    """`turn` as the answer to the chat request `body` (its `stream` says whether to stream)."""
    if turn.failed:
        retry = (("retry-after", turn.retry_after),) if turn.retry_after else ()
        return Answer(turn.status, json=error_body(turn), headers=retry, silence=turn.silence)
    if not body.get("stream"):
        return Answer(200, json=chat_response(turn), silence=turn.silence)
    stream = Paced(turn, stream_payloads(turn), _encoder(turn))
    return Answer(200, stream=stream, headers=SSE_HEADERS, silence=turn.silence)


def models(names: tuple[str, ...]) -> Answer:
    """The answer of `GET /v1/models`: one page (no `next_page_token`), Cohere's list shape."""
    data = [
        {
            "name": m,
            "endpoints": ["chat"],
            "finetuned": False,
            "context_length": CONTEXT_LENGTH,
            "is_deprecated": False,
            "features": ["tools", "json_mode", "json_schema"],
        }
        for m in names
    ]
    return Answer(200, json={"models": data})


def failure(status: int, message: str) -> Answer:
    """An error the fake itself answers (a refused request, a broken script)."""
    return Answer(status, json=error_body(Turn(status=status, error_message=message)))


def error_body(turn: Turn) -> dict[str, Any]:
    """`turn`'s error in Cohere's JSON shape: an id and a message (Cohere sends no error type or code)."""
    return {"id": REQUEST_ID, "message": turn.error_message}


def finish_reason(turn: Turn) -> str:
    """Why the answer ends, in Cohere's words."""
    reason = turn.finish_reason or ("tool_calls" if turn.calls else "stop")
    return FINISH_REASONS.get(reason, reason)


def usage(turn: Turn) -> dict[str, Any] | None:
    """The round's usage as Cohere reports it: billed units and tokens alike here, the cache's hits apart."""
    if turn.usage is None:
        return None
    prompt, answered = turn.usage
    counts = {"input_tokens": prompt, "output_tokens": answered}
    report: dict[str, Any] = {"billed_units": dict(counts), "tokens": dict(counts)}
    if turn.cache_read_tokens:
        report["cached_tokens"] = turn.cache_read_tokens
    return report


def stream_payloads(turn: Turn) -> list[str]:
    """The events of `turn`'s stream (`STALL` marks a pause)."""
    if turn.shape == "raw":
        return [_raw_event(payload) for payload in turn.chunks]
    start = _event(
        "message-start",
        {
            "id": MESSAGE_ID,
            "delta": {
                "message": {"role": "assistant", "content": [], "tool_plan": "", "tool_calls": [], "citations": []}
            },
        },
    )
    if turn.shape == "stream_error":
        # Cohere reports a generation that failed once streaming as the message's end: `ERROR`, and why.
        return [start, _event("message-end", {"delta": {"error": turn.error_message, "finish_reason": "ERROR"}})]
    if turn.shape == "empty":
        return [start, _event("message-end", {"delta": {}})]
    events = [start, *_text_events(turn)]
    if turn.shape == "malformed":
        return [*events, "event: content-delta\ndata: {not json"]
    if turn.stall:
        events.append(STALL)
    if turn.pieces and not turn.calls:
        events.append(_event("content-end", {"index": 0}))
    for number, call in enumerate(turn.calls):
        events += _tool_call_events(turn, number, call)
    if not turn.finish:
        return events
    end: dict[str, Any] = {"finish_reason": finish_reason(turn)}
    reported = usage(turn)
    if reported is not None:
        end["usage"] = reported
    return [*events, _event("message-end", {"delta": end})]


def _text_events(turn: Turn) -> list[str]:
    """The text: the tool plan of a round that calls tools, else one content block."""
    if turn.calls:
        return [_event("tool-plan-delta", {"delta": {"message": {"tool_plan": piece}}}) for piece in turn.pieces]
    if not turn.pieces and turn.shape != "malformed":
        return []
    opened = _event("content-start", {"index": 0, "delta": {"message": {"content": {"type": "text", "text": ""}}}})
    deltas = [
        _event("content-delta", {"index": 0, "delta": {"message": {"content": {"text": piece}}}})
        for piece in turn.pieces
    ]
    return [opened, *deltas]


def _tool_call_events(turn: Turn, index: int, call: ToolCallScript) -> list[str]:
    """A tool call: its start (id, name, empty arguments), its arguments in pieces of `split_arguments`, its end."""
    head = {"id": call_id(call, index), "type": "function", "function": {"name": call.name, "arguments": ""}}
    events = [_event("tool-call-start", {"index": index, "delta": {"message": {"tool_calls": head}}})]
    arguments = call.arguments_json
    step = max(1, turn.split_arguments)
    for at in range(0, len(arguments), step):
        fragment = {"function": {"arguments": arguments[at : at + step]}}
        events.append(_event("tool-call-delta", {"index": index, "delta": {"message": {"tool_calls": fragment}}}))
    events.append(_event("tool-call-end", {"index": index}))
    return events


def chat_response(turn: Turn) -> dict[str, Any]:
    """`turn` as one chat response (a request that does not stream)."""
    message: dict[str, Any] = {"role": "assistant"}
    if turn.calls:
        if turn.content:
            message["tool_plan"] = turn.content
        message["tool_calls"] = [
            {
                "id": call_id(call, n),
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments_json},
            }
            for n, call in enumerate(turn.calls)
        ]
    elif turn.content:
        message["content"] = [{"type": "text", "text": turn.content}]
    response: dict[str, Any] = {"id": MESSAGE_ID, "finish_reason": finish_reason(turn), "message": message}
    reported = usage(turn)
    if reported is not None:
        response["usage"] = reported
    return response


def call_id(call: ToolCallScript, number: int) -> str:
    """The call's scripted id, else `<tool name>_<n>` (Cohere's ids start with the tool's name)."""
    return call.call_id or f"{call.name}_{number}"


def _event(kind: str, data: Mapping[str, Any]) -> str:
    """One event: its name line, and its data with the same `type` first (as Cohere sends it)."""
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}"


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
    """A `content-delta` event whose text is replaced by the send time in ns (for latency benches)."""
    name, _, data = payload.partition("\ndata: ")
    if name != "event: content-delta":
        return payload
    event = json.loads(data)
    event["delta"]["message"]["content"]["text"] = f"{time.time_ns()} "
    return f"{name}\ndata: {json.dumps(event)}"
