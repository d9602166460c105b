"""The caller's side of a model-gateway run: its own functions, tool choice and answer format.

An OpenAI door sends them in `GATEWAY_METADATA_KEY` when a client brings its own `tools` or a
JSON `response_format` (LangChain's `bind_tools`, a PydanticAI agent's tools). Ingress validated
them; this reads them defensively all the same (a submission may come from any bus client): what
is malformed is left out, and a run whose gateway part cannot be read at all runs without it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from atmosphere.bus.runs import GATEWAY_METADATA_KEY
from atmosphere.contracts.run.v1.run_pb2 import RunSubmission
from atmosphere.sdk import ChatMessage, MessageToolCall
from atmosphere.sdk.runtime import ToolSpec

log = logging.getLogger("atmosphere.dispatch")

MAX_TURNS = 200
"""Most turns read from a history or a continuation (the door admits no more)."""
MAX_CONTINUATION = 1024
"""Most turns of a continuation (the OpenAI doors admit no more messages in all)."""
MAX_CLIENT_TOOLS = 128
"""Most functions a caller may bring (OpenAI's own limit)."""
TURN_ROLES = frozenset({"system", "user", "assistant", "tool"})


def turns_of(raw: Any, *, limit: int = MAX_TURNS, calls: Collection[str] = ()) -> tuple[ChatMessage, ...]:
    """Chat turns from their JSON form (`{role, content, tool_calls?, tool_call_id?}`), the last `limit`.

    A `tool` turn answering no call made before it (among the kept turns, or `calls`) is left out:
    cutting a long history can separate a result from its call, and a provider refuses the whole
    request for one such result.
    """
    if not isinstance(raw, list):
        return ()
    kept: list[ChatMessage] = []
    made = set(calls)
    for item in raw[-limit:]:
        turn = _turn(item)
        if turn is None or (turn.role == "tool" and turn.tool_call_id not in made):
            continue
        made.update(c.call_id for c in turn.tool_calls)
        kept.append(turn)
    return tuple(kept)


def _turn(item: Any) -> ChatMessage | None:
    if not isinstance(item, dict) or item.get("role") not in TURN_ROLES or not isinstance(item.get("content"), str):
        return None
    calls = tuple(
        MessageToolCall(str(c["id"]), str(c["name"]), str(c.get("arguments") or "{}"))
        for c in item.get("tool_calls") or ()
        if isinstance(c, dict) and isinstance(c.get("id"), str) and isinstance(c.get("name"), str)
    )
    call_id = item.get("tool_call_id")
    if item["role"] == "tool" and not (isinstance(call_id, str) and call_id):
        return None  # a result bound to no call: a provider would refuse the whole request
    return ChatMessage(item["role"], item["content"], calls, call_id if isinstance(call_id, str) else "")


@dataclass(frozen=True)
class ClientExchange:
    """What a caller brought besides its messages."""

    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str | Mapping[str, Any] | None = None
    answer_format: Mapping[str, Any] | None = None
    continuation: tuple[ChatMessage, ...] = ()


NO_EXCHANGE = ClientExchange()


def client_exchange_of(run: RunSubmission, *, reserved: Collection[str] = ()) -> ClientExchange:
    """The caller's functions, tool choice, answer format and continuation; empty for an ordinary run.

    A function named as one of the agent's own tools (`reserved`) is left out: the agent's runs
    server-side, and a call of that name is never handed back.
    """
    raw = run.metadata.get(GATEWAY_METADATA_KEY)
    if not raw:
        return NO_EXCHANGE
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        log.warning("run %s: ignoring malformed %s", run.run_id, GATEWAY_METADATA_KEY)
        return NO_EXCHANGE
    if not isinstance(body, dict):
        return NO_EXCHANGE
    choice = body.get("tool_choice")
    answer_format = body.get("response_format")
    return ClientExchange(
        tools=tuple(t for t in _tools(body.get("tools")) if t.name not in reserved),
        tool_choice=choice if isinstance(choice, str | dict) else None,
        answer_format=answer_format if isinstance(answer_format, dict) else None,
        # Whole (the door admits at most MAX_CONTINUATION): its results answer its own calls.
        continuation=turns_of(body.get("continuation"), limit=MAX_CONTINUATION),
    )


def _tools(raw: Any) -> tuple[ToolSpec, ...]:
    if not isinstance(raw, list):
        return ()
    return tuple(
        ToolSpec(name=t["name"], description=str(t.get("description") or ""), parameters=t["parameters"])
        for t in raw[:MAX_CLIENT_TOOLS]
        if isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("parameters"), dict)
    )
