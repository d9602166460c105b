"""The scripted model on the Gemini API's wire, as `google-genai` calls it.

Routes (under `…/v1beta/`, the version prefix the client adds to its base URL):

- `POST …/models/{model}:streamGenerateContent?alt=sse`: a server-sent-event stream whose every
  event is one `data:` line holding a `GenerateContentResponse` (`stream_payloads`) — a chunk per
  text piece (`candidates[0].content.parts[].text`), then one chunk with the function calls, the
  `finishReason` and the round's whole `usageMetadata`. The stream has no end marker: it ends
  when the answer does. Function calls arrive whole (`functionCall {id?, name, args}`): Gemini
  sends no argument deltas;
- `POST …/models/{model}:generateContent`: the same answer as one JSON `GenerateContentResponse`
  (`response`);
- `GET …/models`: the model listing (`models`).

Errors are Google's JSON shape, `{"error": {"code", "message", "status"}}` with the status's
canonical name (429 `RESOURCE_EXHAUSTED`, 503 `UNAVAILABLE`, …, `STATUS_NAMES`); a retry delay is
both the `Retry-After` header and a `google.rpc.RetryInfo` detail, as Google's API says it. The
same `Turn`s script this wire, OpenAI's (`atmosphere.testing.openai_wire`) and Anthropic's.

Usage reads as Gemini counts it: `promptTokenCount` is the turn's input (cached tokens included,
`cachedContentTokenCount` naming those), `candidatesTokenCount` its output; every chunk before
the last repeats the prompt count alone, as Gemini's chunks do, so a client that adds up chunks
instead of keeping the last count is caught.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from atmosphere.testing.model_stream import STALL, Answer, Paced
from atmosphere.testing.model_turns import ModelRequest, ToolCallScript, Turn

API_KEY_HEADER = "x-goog-api-key"
"""Sent by every `google-genai` client with an API key: what tells its requests from other wires'."""
PREFIX = "/v1beta/"
STREAM_METHOD = ":streamGenerateContent"
CALL_METHOD = ":generateContent"
RESPONSE_ID = "resp_fake"
SSE_HEADERS = (("content-type", "text/event-stream"), ("cache-control", "no-cache"))
FINISH_REASONS = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS", "content_filter": "SAFETY"}
"""`Turn.finish_reason` (OpenAI's words) in Gemini's: a round of function calls ends with `STOP`
too; any other word is sent as it is (e.g. `RECITATION`, `MALFORMED_FUNCTION_CALL`)."""
STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "NOT_IMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
"""The canonical `google.rpc.Code` name Google's APIs send with each HTTP status."""
RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
_MODEL = re.compile(r"/models/([^/:]+):")


def claims(method: str, path: str, headers: Mapping[str, str]) -> bool:
    """Whether a request is on this wire: any `…/v1beta/…` route, or any request of a `google-genai` client."""
    del method
    return PREFIX in path or any(name.lower() == API_KEY_HEADER for name in headers)


def is_call(method: str, path: str) -> bool:
    """The routes of a model call (streamed or not)."""
    return method == "POST" and path.endswith((STREAM_METHOD, CALL_METHOD))


def is_stream(path: str) -> bool:
    """Whether the call at `path` streams (`:streamGenerateContent`): Gemini says so in the route, not the body."""
    return path.endswith(STREAM_METHOD)


def is_models(method: str, path: str) -> bool:
    """The route listing the models."""
    return method == "GET" and path.rstrip("/").endswith("/v1beta/models")


def request_of(body: Mapping[str, Any], headers: Mapping[str, str]) -> ModelRequest:
    """What a `generateContent` request asks, for the script: its `contents` and declared functions."""
    tools = tuple(
        str(declaration.get("name", ""))
        for tool in body.get("tools", ())
        if isinstance(tool, Mapping)
        for declaration in tool.get("functionDeclarations", ())
        if isinstance(declaration, Mapping)
    )
    return ModelRequest(messages=tuple(body.get("contents", ())), tools=tools, body=body, headers=headers)


def answer(turn: Turn, body: Mapping[str, Any], path: str) -> Answer:
    """`turn` as the answer to the call `body` at `path` (the route says whether to stream)."""
    del body
    if turn.failed:
        retry = (("retry-after", turn.retry_after),) if turn.retry_after else ()
        return Answer(turn.status, json=error_body(turn), headers=retry, silence=turn.silence)
    model = model_of(path)
    if not is_stream(path):
        return Answer(200, json=response(turn, model), silence=turn.silence)
    stream = Paced(turn, stream_payloads(turn, model), _encoder(turn))
    return Answer(200, stream=stream, headers=SSE_HEADERS, silence=turn.silence)


def model_of(path: str) -> str:
    """The model a call's route names (`…/models/gemini-2.5-flash:generateContent`)."""
    found = _MODEL.search(path)
    return found.group(1) if found else "fake-model"


def models(names: tuple[str, ...]) -> Answer:
    """The answer of `GET /v1beta/models`: one page, Gemini's list shape."""
    listed = [
        {
            "name": f"models/{name}",
            "version": "001",
            "displayName": name,
            "inputTokenLimit": 1048576,
            "outputTokenLimit": 65536,
            "supportedGenerationMethods": ["generateContent", "countTokens"],
        }
        for name in names
    ]
    return Answer(200, json={"models": listed})


def failure(status: int, message: str) -> Answer:
    """An error the fake itself answers (no route, a refused request, a broken script)."""
    return Answer(status, json=error_body(Turn(status=status, error_message=message)))


def error_body(turn: Turn) -> dict[str, Any]:
    """`turn`'s error in Google's JSON shape; a retry delay as a `RetryInfo` detail too."""
    error: dict[str, Any] = {"code": turn.status, "message": turn.error_message, "status": status_name(turn)}
    if turn.retry_after:
        error["details"] = [{"@type": RETRY_INFO, "retryDelay": f"{turn.retry_after}s"}]
    return {"error": error}


def status_name(turn: Turn) -> str:
    """The scripted `error_type` when it is one of Google's status names, else the one its status implies."""
    if turn.error_type in STATUS_NAMES.values():
        return turn.error_type
    if turn.status in STATUS_NAMES:
        return STATUS_NAMES[turn.status]
    return "FAILED_PRECONDITION" if 400 <= turn.status < 500 else "UNKNOWN"


def finish_reason(turn: Turn) -> str:
    """Why the answer ends, in Gemini's words."""
    reason = turn.finish_reason or "stop"
    return FINISH_REASONS.get(reason, reason)


def stream_payloads(turn: Turn, model: str) -> list[str]:
    """The `data:` payloads of `turn`'s stream (`STALL` marks a pause)."""
    if turn.shape == "stream_error":
        return [json.dumps(error_body(Turn(status=500, error_message=turn.error_message, error_type=turn.error_type)))]
    if turn.shape == "raw":
        return list(turn.chunks)
    if turn.shape == "empty":
        return []
    prompt = turn.usage[0] if turn.usage else 0
    chunks = [json.dumps(_chunk(model, [{"text": piece}], prompt=prompt)) for piece in turn.pieces]
    if turn.shape == "malformed":
        return [*chunks, "{not json"]
    if turn.stall:
        chunks.append(STALL)
    if not turn.finish:
        return chunks
    last = _chunk(model, [_function_call(call) for call in turn.calls], prompt=prompt)
    last["candidates"][0]["finishReason"] = finish_reason(turn)
    last["usageMetadata"] = usage_metadata(turn)
    return [*chunks, json.dumps(last)]


def response(turn: Turn, model: str) -> dict[str, Any]:
    """`turn` as one `GenerateContentResponse` (a call that does not stream)."""
    parts: list[dict[str, Any]] = [{"text": turn.content}] if turn.content else []
    parts += [_function_call(call) for call in turn.calls]
    whole = _chunk(model, parts, prompt=0)
    whole["candidates"][0]["finishReason"] = finish_reason(turn)
    whole["usageMetadata"] = usage_metadata(turn)
    return whole


def usage_metadata(turn: Turn) -> dict[str, Any]:
    """The round's whole `usageMetadata` (none counted when the turn reports no usage)."""
    if turn.usage is None:
        return {}
    prompt, answered = turn.usage
    usage: dict[str, Any] = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": answered,
        "totalTokenCount": prompt + answered,
    }
    if turn.cache_read_tokens:
        usage["cachedContentTokenCount"] = turn.cache_read_tokens
    return usage


def _chunk(model: str, parts: list[dict[str, Any]], *, prompt: int) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "candidates": [{"content": {"parts": parts, "role": "model"}, "index": 0}],
        "modelVersion": model,
        "responseId": RESPONSE_ID,
    }
    if prompt:
        chunk["usageMetadata"] = {"promptTokenCount": prompt, "totalTokenCount": prompt}
    return chunk


def _function_call(call: ToolCallScript) -> dict[str, Any]:
    """A `functionCall` part: its `id` only when scripted (the Gemini API mostly sends none)."""
    function_call: dict[str, Any] = {"name": call.name, "args": _args(call.arguments_json)}
    if call.call_id:
        function_call["id"] = call.call_id
    return {"functionCall": function_call}


def _args(arguments: str) -> Any:
    """A call's `args` object (`{}` when the scripted arguments are not a JSON object)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _encoder(turn: Turn) -> Callable[[str], bytes]:
    """How each payload goes out: one `data:` line and a blank line, its text stamped at send time if asked."""

    def encode(payload: str) -> bytes:
        return f"data: {_stamped(payload) if turn.timestamps else payload}\r\n\r\n".encode()

    return encode


def _stamped(payload: str) -> str:
    """A text chunk whose text is replaced by the send time in ns (for latency benches)."""
    try:
        chunk = json.loads(payload)
        parts = chunk["candidates"][0]["content"]["parts"]
    except (ValueError, KeyError, IndexError, TypeError):
        return payload
    if len(parts) == 1 and "text" in parts[0]:
        parts[0]["text"] = f"{time.time_ns()} "
        return json.dumps(chunk)
    return payload
