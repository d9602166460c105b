"""When a conversation ends: a WebSocket leaves, or nobody spoke in it for a while.

Ingress announces it on `atmo.conv.closed` (dispatch then extracts long-term facts from the
conversation). A conversation is announced once per stretch of activity: a new prompt in it
opens it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from atmosphere.bus import Bus, BusError, subjects
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.memory.v1.memory_pb2 import ConversationClosed

log = logging.getLogger("atmosphere.ingress")

Key = tuple[str, str]
"""(agent, conversation id)."""


@dataclass
class _Open:
    principal: Principal
    last_active: float
    sockets: int = 0


class ConversationTracker:
    """The conversations with recent activity on this ingress instance (bounded)."""

    def __init__(self, bus: Bus, *, idle_timeout: float, max_open: int = 100_000) -> None:
        """Announce conversations idle for `idle_timeout` seconds; track at most `max_open`."""
        self._bus = bus
        self._idle_timeout = idle_timeout
        self._max_open = max_open
        self._open: dict[Key, _Open] = {}
        self._publishing: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._open)

    def touch(self, agent: str, conversation_id: str, principal: Principal) -> None:
        """A prompt arrived in this conversation."""
        key = (agent, conversation_id)
        entry = self._open.get(key)
        if entry is None:
            if len(self._open) >= self._max_open:
                # Bounded: the stalest conversation is announced early rather than growing forever.
                stalest = min(self._open, key=lambda k: self._open[k].last_active)
                self._announce(stalest, "idle")
            self._open[key] = _Open(principal, time.monotonic())
        else:
            entry.last_active = time.monotonic()

    def socket_opened(self, agent: str, conversation_id: str, principal: Principal) -> None:
        """A WebSocket now serves this conversation."""
        self.touch(agent, conversation_id, principal)
        self._open[(agent, conversation_id)].sockets += 1

    def socket_closed(self, agent: str, conversation_id: str) -> None:
        """A WebSocket of this conversation left; the last one to leave closes the conversation."""
        key = (agent, conversation_id)
        entry = self._open.get(key)
        if entry is None:
            return
        entry.sockets -= 1
        if entry.sockets <= 0:
            self._announce(key, "disconnect")

    def sweep(self, now: float | None = None) -> int:
        """Announce every conversation idle past the timeout; how many were announced."""
        now = time.monotonic() if now is None else now
        # A conversation with a WebSocket still open ends when the last socket leaves.
        idle = [k for k, e in self._open.items() if not e.sockets and now - e.last_active >= self._idle_timeout]
        for key in idle:
            self._announce(key, "idle")
        return len(idle)

    def _announce(self, key: Key, reason: str) -> None:
        entry = self._open.pop(key)
        closed = ConversationClosed(agent=key[0], conversation_id=key[1], principal=entry.principal, reason=reason)
        task = asyncio.get_running_loop().create_task(self._publish(closed))
        self._publishing.add(task)
        task.add_done_callback(self._publishing.discard)

    async def _publish(self, closed: ConversationClosed) -> None:
        try:
            await self._bus.publish(subjects.conversation_closed(), closed)
        except BusError as exc:
            log.warning("could not announce the end of conversation %s (%s)", closed.conversation_id, exc)

    async def run_sweeper(self, stop: asyncio.Event, *, every: float = 30.0) -> None:
        """Sweep until `stop` is set."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), min(every, self._idle_timeout))
            self.sweep()
