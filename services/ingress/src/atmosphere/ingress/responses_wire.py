"""The OpenAI Responses wire: validating `POST /v1/responses` bodies and shaping Response objects and events.

What this server does not do exactly is refused (`unsupported_parameter`), never half-done:
hosted tools, reasoning, background runs. Function tools make it a model gateway, as Chat
Completions' `tools` do (`client_functions`): the model's calls come back as `function_call`
output items, and `function_call_output` input items continue the exchange; a `text.format` of
`json_schema` or `json_object` is asked of the model as sent. Sampling parameters are accepted
(when well-typed) and ignored, as for Chat Completions: the agent's configuration decides.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from atmosphere.bus import subjects
from atmosphere.contracts.run.v1.run_pb2 import ToolStart
from atmosphere.ingress.client_functions import (
    Function,
    Gateway,
    function,
    functions_of,
    json_schema,
    response_format_of,
    split_exchange,
    tool_choice_of,
)
from atmosphere.ingress.errors import OpenAiError, OpenAiInvalidRequestError
from atmosphere.ingress.openai_wire import MAX_MESSAGES, MAX_MODEL_CHARS, json_body, unsupported

RESPONSE_PREFIX = "resp_"
ROLES = frozenset({"user", "assistant", "system", "developer"})
UNSUPPORTED = {
    "reasoning": "Reasoning options",
    "background": "Background responses",
    "conversation": "'conversation' (use previous_response_id)",
    "prompt": "Stored prompts",
}


@dataclass(frozen=True)
class ResponsesRequest:
    """A validated Responses request."""

    model: str | None
    prompt: str | None
    """The last user input; None when the input only continues the previous response's calls."""
    prior: list[dict[str, Any]] = field(default_factory=list)
    """Earlier input items as history turns (instructions first, as a system message)."""
    gateway: Gateway = field(default_factory=Gateway)
    """The client's function tools, tool choice, format, and the exchange after `prompt`."""
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


def _items(raw: Any) -> list[dict[str, Any]]:
    """Input items as history turns: messages, and the model's function calls and their outputs."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise OpenAiInvalidRequestError("'input' must be a string or a non-empty array.", param="input")
    if len(raw) > MAX_MESSAGES:
        raise OpenAiInvalidRequestError(f"'input' may hold at most {MAX_MESSAGES} items.", param="input")
    items: list[dict[str, Any]] = []
    for index, item in enumerate(raw):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise OpenAiInvalidRequestError(f"{where} must be an object.", param="input")
        kind = item.get("type", "message")
        if kind == "function_call":
            _add_call(items, item, where)
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise OpenAiInvalidRequestError(f"{where}.call_id must be a non-empty string.", param="input")
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, where)
            items.append({"role": "tool", "content": text, "tool_call_id": call_id})
        elif kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise OpenAiInvalidRequestError(f"{where}.role must be one of {sorted(ROLES)}.", param="input")
            role = "system" if role == "developer" else role
            items.append({"role": role, "content": _text(item.get("content"), where)})
        else:
            raise unsupported("input", f"{where}: items of type '{str(kind)[:40]}'")
    return items


def _add_call(items: list[dict[str, Any]], item: dict[str, Any], where: str) -> None:
    """A `function_call` item: joined to the assistant turn before it (one turn holds a round's calls)."""
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "{}")
    if not (isinstance(call_id, str) and call_id and isinstance(name, str) and isinstance(arguments, str)):
        raise OpenAiInvalidRequestError(f"{where} must be {{call_id, name, arguments}} strings.", param="input")
    call = {"id": call_id, "name": name, "arguments": arguments or "{}"}
    last = items[-1] if items else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        items.append({"role": "assistant", "content": "", "tool_calls": [call]})


def _check_outputs(items: list[dict[str, Any]], known: set[str]) -> None:
    """Every `function_call_output` answers a call made before it (in the input, or by the previous response)."""
    calls = set(known)
    for turn in items:
        calls.update(c["id"] for c in turn.get("tool_calls", ()))
        if turn["role"] == "tool" and turn["tool_call_id"] not in calls:
            raise OpenAiInvalidRequestError(
                f"No function call with call_id '{turn['tool_call_id'][:64]}' was made before its output.",
                param="input",
            )


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
    """A `POST /responses` body, validated; `OpenAiError` for anything refused.

    The previous response's calls are not known here: outputs that answer no call of the input
    are checked against them by `check_outputs` once the previous response is read.
    """
    body = json_body(raw)
    for name, what in UNSUPPORTED.items():
        if body.get(name) not in (None, [], "auto", "none", False):
            raise unsupported(name, what)
    functions = functions_of(body.get("tools"), _function)
    tool_choice = tool_choice_of(body.get("tool_choice"), functions, nested=False)
    response_format = _text_format(body.get("text"))
    model, user, stream, instructions = _scalars(body)
    previous_run = _previous_run(body.get("previous_response_id"))
    items = _items(body.get("input"))
    asked, gateway = split_exchange(
        items, functions=functions, tool_choice=tool_choice, response_format=response_format
    )
    continuation = gateway.continuation
    if (asked is not None and not items[asked]["content"].strip()) or (
        continuation and continuation[-1]["role"] != "tool"
    ):
        raise OpenAiInvalidRequestError(
            "The last input item must be a non-empty user message, or the outputs of the function calls "
            "that followed it.",
            param="input",
        )
    if asked is None and previous_run is None:
        raise OpenAiInvalidRequestError(
            "Function call outputs without a user message continue a previous response: send 'previous_response_id'.",
            param="input",
        )
    prior = ([{"role": "system", "content": instructions}] if instructions else []) + (
        items[:asked] if asked is not None else []
    )
    return ResponsesRequest(
        model=model or None,
        prompt=items[asked]["content"] if asked is not None else None,
        prior=prior,
        stream=stream,
        previous_run=previous_run,
        user=user,
        gateway=gateway,
    )


def _scalars(body: dict[str, Any]) -> tuple[str | None, str | None, bool, str | None]:
    """`model`, `user`, `stream` and `instructions`, checked (and `parallel_tool_calls`, ignored)."""
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise OpenAiInvalidRequestError("'parallel_tool_calls' must be a boolean.", param="parallel_tool_calls")
    for name in ("model", "user"):
        value = body.get(name)
        if value is not None and (not isinstance(value, str) or len(value) > MAX_MODEL_CHARS):
            raise OpenAiInvalidRequestError(f"'{name}' must be a short string.", param=name)
    stream = body.get("stream")
    stream = False if stream is None else stream
    if not isinstance(stream, bool):
        raise OpenAiInvalidRequestError("'stream' must be a boolean.", param="stream")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise OpenAiInvalidRequestError("'instructions' must be a string.", param="instructions")
    return body.get("model"), body.get("user"), stream, instructions


def _function(index: int, tool: Any) -> Function:
    """A Responses function tool: `{"type": "function", name, description, parameters, strict}`."""
    where = f"tools[{index}]"
    if not isinstance(tool, dict):
        raise OpenAiInvalidRequestError(f"{where} must be an object.", param="tools")
    if tool.get("type") != "function":
        raise unsupported("tools", f"{where}: a tool of type '{str(tool.get('type'))[:40]}' (only 'function')")
    return function(tool.get("name"), tool.get("description"), tool.get("parameters"), where=where)


def _text_format(text: Any) -> dict[str, Any] | None:
    """`text.format` as Chat Completions' `response_format` (None: plain text)."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise OpenAiInvalidRequestError("'text' must be an object.", param="text")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise OpenAiInvalidRequestError("'text.format' must be an object.", param="text.format")
    if fmt.get("type") == "json_schema":
        spec = json_schema(fmt, where="text.format", param="text.format")
        return {"type": "json_schema", "json_schema": spec}
    return response_format_of(fmt, param="text.format")


def check_outputs(asked: ResponsesRequest, previous_calls: set[str]) -> None:
    """Refuse an output that answers no function call (of the input, or of the previous response)."""
    _check_outputs([*asked.prior, *asked.gateway.continuation], previous_calls)


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
        calls: Sequence[ToolStart] = (),
    ) -> dict[str, Any]:
        output = [self.message(text)] if text is not None and (text or not calls) else []
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": [*output, *(function_call(call) for call in calls)],
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


def function_call(call: ToolStart, status: str = "completed") -> dict[str, Any]:
    """A call handed back to the client: a `function_call` output item."""
    return {
        "type": "function_call",
        "id": "fc_" + call.call_id,
        "call_id": call.call_id,
        "name": call.tool_name,
        "arguments": call.arguments_json if status == "completed" else "",
        "status": status,
    }


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
