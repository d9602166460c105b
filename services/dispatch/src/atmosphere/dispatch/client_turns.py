"""The turns a client sent before its prompt, and whether the conversation is the client's or memory's.

The Chat Completions door's client keeps its conversation and sends all of it every time
(`HISTORY_METADATA_KEY`): those turns are the whole history, and conversation memory takes no
part (nothing to load under a key made for one request, nothing left behind under it). The
Responses API's conversation is memory's (`previous_response_id` continues it); its
`instructions` and earlier input items (`CONTEXT_METADATA_KEY`) go after the stored history,
for this response only. Either is read defensively (a submission may come from any bus client):
what is malformed is left out.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from atmosphere.bus.runs import CONTEXT_METADATA_KEY, HISTORY_METADATA_KEY
from atmosphere.contracts.run.v1.run_pb2 import RunSubmission
from atmosphere.dispatch.client_exchange import turns_of
from atmosphere.sdk import ChatMessage

log = logging.getLogger("atmosphere.dispatch")


@dataclass(frozen=True)
class ClientTurns:
    """Turns a client sent before its prompt, and whose conversation it is."""

    turns: tuple[ChatMessage, ...] = ()
    keeps_conversation: bool = False
    """The client keeps the whole conversation: `turns` is all its history, and memory neither
    loads nor records it. Otherwise `turns` follow the history memory keeps, for this run only."""

    @property
    def exchange(self) -> bool:
        """Whether the turns hold a model gateway's tool calls or results (memory keeps text only)."""
        return any(m.tool_calls or m.tool_call_id for m in self.turns)


NO_CLIENT_TURNS = ClientTurns()


def client_turns_of(run: RunSubmission) -> ClientTurns:
    """The turns the client sent with `run`, bounded and sanitized.

    A client's system turns stay turns: they never replace the agent's own system prompt.
    """
    if HISTORY_METADATA_KEY in run.metadata:
        return ClientTurns(_turns(run, HISTORY_METADATA_KEY), keeps_conversation=True)
    if CONTEXT_METADATA_KEY in run.metadata:
        return ClientTurns(_turns(run, CONTEXT_METADATA_KEY))
    return NO_CLIENT_TURNS


def _turns(run: RunSubmission, key: str) -> tuple[ChatMessage, ...]:
    try:
        turns = json.loads(run.metadata[key])
    except (ValueError, RecursionError):
        log.warning("run %s: ignoring malformed %s", run.run_id, key)
        return ()
    return turns_of(turns)
