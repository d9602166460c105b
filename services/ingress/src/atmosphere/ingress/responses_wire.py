"""The OpenAI Responses wire: validating `POST /v1/responses` bodies and shaping Response objects and events.

What this server does not do exactly is refused (`unsupported_parameter`), never half-done:
function and hosted tools, `text.format` other than plain text, reasoning, background runs.
Sampling parameters are accepted (when well-typed) and ignored, as for Chat Completions: the
agent's configuration decides.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from atmosphere.bus import subjects
from atmosphere.ingress.errors import OpenAiError, OpenAiInvalidRequestError
from atmosphere.ingress.openai_wire import MAX_MESSAGES, MAX_MODEL_CHARS, json_body, unsupported

RESPONSE_PREFIX = "resp_"
ROLES = frozenset({"user", "assistant", "system", "developer"})
UNSUPPORTED = {
    "tools": "Function and hosted tools",
    "tool_choice": "'tool_choice'",
    "reasoning": "Reasoning options",
    "background": "Background responses",
    "conversation": "'conversation' (use previous_response_id)",
    "prompt": "Stored prompts",
}


@dataclass(frozen=True)
class ResponsesRequest:
    """A validated Responses request."""

    model: str | None
    prompt: str
    """The last user input."""
    prior: list[dict[str, str]] = field(default_factory=list)
    """Earlier input items as `{role, content}` (instructions first, as a system message)."""
    stream: bool = False
    previous_run: str | None = None
    """The run behind `previous_response_id`, whose conversation this one continues."""
    user: str | None = None


def response_id(run_id: str) -> str:
    """The Response id of a run: what `previous_response_id` names it by."""
    return RESPONSE_PREFIX + run_id


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in {"input_text", "output_text", "text"}:
                raise unsupported("input", f"{where}: a content part that is not text")
            if not isinstance(part.get("text"), str):
                raise OpenAiInvalidRequestError(f"{where}: a text part needs a string 'text'.", param="input")
            parts.append(part["text"])
        return "".join(parts)
    raise OpenAiInvalidRequestError(f"{where}.content must be a string or a list of text parts.", param="input")


def _items(raw: Any) -> list[dict[str, str]]:
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise OpenAiInvalidRequestError("'input' must be a string or a non-empty array.", param="input")
    if len(raw) > MAX_MESSAGES:
        raise OpenAiInvalidRequestError(f"'input' may hold at most {MAX_MESSAGES} items.", param="input")
    items = []
    for index, item in enumerate(raw):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise OpenAiInvalidRequestError(f"{where} must be an object.", param="input")
        kind = item.get("type", "message")
        if kind != "message":
            raise unsupported("input", f"{where}: items of type '{str(kind)[:40]}'")
        role = item.get("role")
        if role not in ROLES:
            raise OpenAiInvalidRequestError(f"{where}.role must be one of {sorted(ROLES)}.", param="input")
        items.append({"role": "system" if role == "developer" else role, "content": _text(item.get("content"), where)})
    return items


def _previous_run(raw: Any) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw.startswith(RESPONSE_PREFIX):
        raise OpenAiInvalidRequestError(
            "'previous_response_id' must be a response id (resp_...).", param="previous_response_id"
        )
    run_id = raw[len(RESPONSE_PREFIX) :]
    try:
        subjects.token(run_id, what="response id")
    except ValueError:
        raise OpenAiInvalidRequestError("'previous_response_id' is malformed.", param="previous_response_id") from None
    return run_id


def parse_responses_request(raw: bytes) -> ResponsesRequest:
    """A `POST /responses` body, validated; `OpenAiError` for anything refused."""
    body = json_body(raw)
    for name, what in UNSUPPORTED.items():
        if body.get(name) not in (None, [], "auto", "none", False):
            raise unsupported(name, what)
    text_format = body.get("text")
    if text_format is not None:
        fmt = text_format.get("format") if isinstance(text_format, dict) else None
        if not (fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text")):
            raise unsupported("text.format", "A 'text.format' other than plain text")
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or len(model) > MAX_MODEL_CHARS):
        raise OpenAiInvalidRequestError("'model' must be a short string.", param="model")
    user = body.get("user")
    if user is not None and (not isinstance(user, str) or len(user) > MAX_MODEL_CHARS):
        raise OpenAiInvalidRequestError("'user' must be a short string.", param="user")
    stream = body.get("stream")
    stream = False if stream is None else stream
    if not isinstance(stream, bool):
        raise OpenAiInvalidRequestError("'stream' must be a boolean.", param="stream")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise OpenAiInvalidRequestError("'instructions' must be a string.", param="instructions")
    items = _items(body.get("input"))
    if items[-1]["role"] != "user" or not items[-1]["content"].strip():
        raise OpenAiInvalidRequestError("The last input item must be a non-empty user message.", param="input")
    prior = ([{"role": "system", "content": instructions}] if instructions else []) + items[:-1]
    return ResponsesRequest(
        model=model or None,
        prompt=items[-1]["content"],
        prior=prior,
        stream=stream,
        previous_run=_previous_run(body.get("previous_response_id")),
        user=user,
    )


@dataclass
class ResponseShape:
    """One Response as the client sees it: its ids, and the objects and events that describe it."""

    run_id: str
    model: str
    previous_response_id: str | None = None
    created_at: int = field(default_factory=lambda: int(time.time()))
    message_id: str = field(default_factory=lambda: "msg_" + uuid.uuid4().hex)
    sequence: int = 0

    @property
    def id(self) -> str:
        return response_id(self.run_id)

    def message(self, text: str, *, status: str = "completed") -> dict[str, Any]:
        return {
            "type": "message",
            "id": self.message_id,
            "status": status,
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
            if text or status == "completed"
            else [],
        }

    def response(
        self,
        status: str,
        *,
        text: str | None = None,
        usage: dict[str, int] | None = None,
        error: OpenAiError | None = None,
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": [self.message(text)] if text is not None else [],
            "usage": _usage(usage) if usage else None,
            "previous_response_id": self.previous_response_id,
            "error": {"code": error.code or error.type, "message": error.message} if error else None,
            "incomplete_details": None,
            "instructions": None,
            "metadata": {},
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "text": {"format": {"type": "text"}},
            "temperature": None,
            "top_p": None,
        }

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        """A streaming event of `kind` (`response.*`), numbered in order."""
        self.sequence += 1
        return {"type": kind, "sequence_number": self.sequence, **fields}

    def text_event(self, kind: str, **fields: Any) -> dict[str, Any]:
        return self.event(kind, item_id=self.message_id, output_index=0, content_index=0, **fields)


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _usage(usage: dict[str, int]) -> dict[str, Any]:
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage["total_tokens"],
    }
