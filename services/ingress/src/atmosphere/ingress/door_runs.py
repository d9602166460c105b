"""A run started by a protocol door (MCP, AG-UI, A2A): what every door does around a run, once.

The WebSocket, SSE and long-poll doors settle these from their own requests; a protocol door
has a caller and a message, and the rules are the same (mode parity): the caller may use the
agent's path, the message is bounded, the conversation is scoped to the caller (another
user's conversation id never reaches their history), the run fits the broker, a stream slot
is held while the run is followed, the run is owned by the caller and only they (or an admin)
may answer or cancel it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field

from atmosphere.bus import BusError
from atmosphere.bus.runs import ANSWER_REWOUND_METADATA_KEY, cancel_run, follow_run, last_event
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.ingress.access_log import note_run
from atmosphere.ingress.agent_prompts import conversation_of, not_submitted
from atmosphere.ingress.auth import Caller
from atmosphere.ingress.errors import ForbiddenError, RunNotFoundError
from atmosphere.ingress.http import message_limit_of
from atmosphere.ingress.inbound import Prompt, new_run_request, require_fits, require_message_size
from atmosphere.ingress.run_access import check_access
from atmosphere.ingress.state import IngressState
from atmosphere.ingress.stream_limits import claim_stream
from atmosphere.service import StreamSlot

log = logging.getLogger("atmosphere.ingress")


@dataclass
class DoorRun:
    """A submitted run being followed; `close()` gives its stream slot back (and may cancel it)."""

    state: IngressState
    run_id: str
    agent: str
    principal: Principal
    """Who follows it: the run's owner (or an admin), the principal a cancel is sent as."""
    events: AsyncGenerator[RunEvent, None]
    slot: StreamSlot
    finished: bool = False
    """Whether the run's terminal event was read (nothing is left to cancel)."""
    _closed: bool = False

    def __aiter__(self) -> AsyncIterator[RunEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[RunEvent]:
        async for event in self.events:
            if event.WhichOneof("kind") in {"complete", "error"} and not event.origin_run_id:
                self.finished = True
            yield event

    async def close(self, *, cancel_reason: str | None = None) -> None:
        """Stop following; cancel the run (unless it finished) when `cancel_reason` is given. Once.

        The work is shielded: a door closes its run most often because its own call was cancelled
        (a client that cancelled or left), and a cancel that is itself cancelled would leave the
        run going for nobody.
        """
        if self._closed:
            return
        self._closed = True
        self.slot.release()
        cleanup = asyncio.ensure_future(self._stop(cancel_reason))
        _CLEANUPS.add(cleanup)
        cleanup.add_done_callback(_CLEANUPS.discard)
        await asyncio.shield(cleanup)

    async def _stop(self, cancel_reason: str | None) -> None:
        with contextlib.suppress(Exception):
            await self.events.aclose()
        if cancel_reason is None or self.finished:
            return
        try:
            await cancel_run(self.state.bus, self.run_id, cancel_reason, principal=self.principal)
        except BusError as exc:
            log.warning("run %s could not be cancelled: %s", self.run_id, exc)


_CLEANUPS: set[asyncio.Future[None]] = set()
"""Closes in flight, held so that one whose caller was cancelled still runs to its end."""


async def start_run(
    state: IngressState,
    caller: Caller,
    agent: AgentDescriptor,
    message: str,
    *,
    transport: str,
    address: str,
    conversation: str | None = None,
    metadata: dict[str, str] | None = None,
) -> DoorRun:
    """Submit `message` to `agent` for `caller` and follow it; a typed `IngressError` says why not.

    The run's first event (its id, seq 1) is read before this returns, so a run the broker could
    not take is an error here, never a stream that starts and fails.
    """
    if not caller.may_use(agent.path):
        msg = f"This token may not use {agent.path}"
        raise ForbiddenError(msg)
    require_message_size(message, message_limit_of(state))
    conversation_id = conversation_of(conversation, caller.principal)
    run = new_run_request(
        agent=agent.name,
        prompt=Prompt(text=message, metadata=metadata or {}),
        conversation_id=conversation_id,
        principal=caller.principal,
        transport=transport,
        path=agent.path,
        pool=agent.pool,
    )
    require_fits(run, state.bus.max_payload)
    state.conversations.touch(agent.name, conversation_id, caller.principal)
    # Claimed before the run is submitted: a refused client starts nothing.
    slot = claim_stream(state.streams, caller.principal, address)
    events = follow_run(state.bus, run.run_id, submit=run)
    try:
        first = await anext(events)
    except BusError as exc:
        slot.release()
        raise not_submitted(run, exc) from None
    except BaseException:
        slot.release()
        raise
    note_run(run.run_id, run.agent)
    return DoorRun(state, run.run_id, run.agent, run.principal, _starting_with(first, events), slot)


async def follow_owned_run(
    state: IngressState, caller: Caller, run_id: str, *, address: str, after_seq: int = 0
) -> DoorRun:
    """Follow a stored run of `caller`'s after `after_seq` (`RunNotFoundError` for anyone else's)."""
    slot = claim_stream(state.streams, caller.principal, address)
    try:
        await check_access(state, caller, run_id)
        last = await last_event(state.bus, run_id)
    except BaseException:
        slot.release()
        raise
    if last is None:
        slot.release()
        msg = f"Unknown run {run_id}"
        raise RunNotFoundError(msg)
    note_run(run_id, last.agent)
    return DoorRun(
        state, run_id, last.agent, caller.principal, follow_run(state.bus, run_id, after_seq=after_seq), slot
    )


async def _starting_with(first: RunEvent, rest: AsyncGenerator[RunEvent, None]) -> AsyncGenerator[RunEvent, None]:
    try:
        yield first
        async for event in rest:
            yield event
    finally:
        await rest.aclose()


@dataclass
class AnswerText:
    """A run's answer as one text, as its events arrive (a resumed run's rewound tail dropped)."""

    parts: list[str] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0

    def add(self, event: RunEvent) -> str | None:
        """Take in `event`; the text it adds to the answer, if any (a sub-agent's text is not the answer)."""
        kind = event.WhichOneof("kind")
        if event.origin_run_id:
            return None
        if kind == "text_delta":
            self.parts.append(event.text_delta.text)
            return event.text_delta.text
        if kind == "usage":
            self.input_tokens += event.usage.input_tokens
            self.output_tokens += event.usage.output_tokens
        elif kind == "metadata" and event.metadata.key == ANSWER_REWOUND_METADATA_KEY:
            self._rewind(event.metadata.value_json)
        elif kind == "complete" and not self.parts and event.complete.summary:
            self.parts.append(event.complete.summary)
            return event.complete.summary
        return None

    def _rewind(self, value_json: str) -> None:
        try:
            discard = max(0, int(json.loads(value_json)["discard"]))
        except (ValueError, TypeError, KeyError):
            return
        text = self.text
        self.parts[:] = [text[: max(0, len(text) - discard)]]

    @property
    def text(self) -> str:
        return "".join(self.parts)
