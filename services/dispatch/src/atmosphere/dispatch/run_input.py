"""A model exchange's input: the journal's seed of it, and the `input` event the tape records.

The input is what the model is given — system prompt, history, the user's message — after the
history was loaded and the interceptors and recalled facts changed it. A durable run journals it
(Atmosphere's RunSeed) so that a resumed run asks the model exactly what it asked before, even if
the conversation's history moved on meanwhile.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from atmosphere.bus.sizes import clip
from atmosphere.contracts.run.v1.run_pb2 import InputMessage, RunEvent, RunInput, ToolStart
from atmosphere.sdk import AiRequest, ChatMessage, MessageToolCall
from atmosphere.sdk._request import Role

_EVENT_ROOM = 512
"""Bytes of an `input` event besides its messages (ids, framing)."""


def seed_json(request: AiRequest, *, conversation_id: str, user_id: str, path: str, tools_digest: str) -> str:
    """The journal's payload for the input of `request` (the seed's fields)."""
    return json.dumps(
        {
            "model": request.model,
            "messages": [_said(m) for m in request.messages()],
            "toolsDigest": tools_digest,
            "responseType": "json_schema" if request.response_format is not None else None,
            "conversationId": conversation_id,
            "userId": user_id,
            "endpointPath": path,
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )


def seeded(request: AiRequest, seed: str) -> AiRequest:
    """`request` asking what the seed recorded: system messages → system prompt, the last → the message.

    Raises:
        ValueError: the seed is not one `seed_json` wrote.
    """
    try:
        messages = [_heard(m) for m in json.loads(seed)["messages"]]
    except (TypeError, KeyError, AttributeError) as exc:
        msg = f"not a run seed: {exc}"
        raise ValueError(msg) from exc
    if not messages:
        msg = "a run seed without messages"
        raise ValueError(msg)
    *rest, last = messages
    system = "\n".join(m.content for m in rest if m.role == "system")
    history = tuple(m for m in rest if m.role != "system")
    return dataclasses.replace(request, message=last.content, system_prompt=system, history=history)


def _said(message: ChatMessage) -> dict[str, object]:
    """A message in the seed: a client's function calls and a `tool` turn's call id kept (a gateway's history)."""
    said: dict[str, object] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        said["tool_calls"] = [{"id": c.call_id, "name": c.name, "arguments": c.arguments} for c in message.tool_calls]
    if message.tool_call_id:
        said["tool_call_id"] = message.tool_call_id
    return said


def _heard(said: Any) -> ChatMessage:
    calls = said.get("tool_calls") or ()
    return ChatMessage(
        _role(said["role"]),
        str(said["content"]),
        tuple(MessageToolCall(str(c["id"]), str(c["name"]), str(c["arguments"])) for c in calls),
        str(said.get("tool_call_id") or ""),
    )


def _role(value: object) -> Role:
    role = str(value)
    ChatMessage(role, "")  # type: ignore[arg-type]  # refuses an unknown role
    return role  # type: ignore[return-value]


def input_event(request: AiRequest, *, limit: int) -> RunEvent:
    """The `input` event of `request`, within `limit` bytes: the oldest history goes first, then text is cut."""
    messages = [_input_message(m) for m in request.messages()]
    event = RunEvent(input=RunInput(messages=messages, model=request.model or ""))
    room = limit - _EVENT_ROOM
    omitted = 0
    first_history = 1 if request.system_prompt else 0
    while event.ByteSize() > room and len(event.input.messages) > first_history + 1:
        del event.input.messages[first_history]
        omitted += 1
    event.input.omitted_messages = omitted
    if event.ByteSize() > room:
        share = max(64, room // max(1, len(event.input.messages)) - 16)
        for message in event.input.messages:
            message.content = clip(message.content, share, "this message")
        event.input.clipped = True
    return event


def _input_message(message: ChatMessage) -> InputMessage:
    calls = [ToolStart(tool_name=c.name, call_id=c.call_id, arguments_json=c.arguments) for c in message.tool_calls]
    return InputMessage(role=message.role, content=message.content, tool_calls=calls, tool_call_id=message.tool_call_id)
