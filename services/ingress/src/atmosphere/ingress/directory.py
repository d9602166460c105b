"""The agent directory: a cached view of `ATMO_AGENTS`, the descriptors dispatch keeps alive.

An entry of the bucket expires when no dispatch rewrites it any more (see
`atmosphere.dispatch.descriptors`), so what the directory lists is what some dispatch serves now.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from atmosphere.bus import Bus, BusError, subjects
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor

log = logging.getLogger("atmosphere.ingress")


class AgentDirectory:
    """Which agents exist and where, from the `ATMO_AGENTS` bucket that dispatch fills."""

    def __init__(
        self,
        bus: Bus,
        *,
        ttl: float = 2.0,
        miss_ttl: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Read from `bus`, caching the bucket for `ttl` seconds (`miss_ttl` after a miss).

        A miss re-reads sooner, so an agent whose dispatch just started is found within a
        quarter second, while a burst of requests for a name that does not exist still costs
        at most four bucket reads a second. `clock` is monotonic seconds (a test's own clock).
        """
        self._bus = bus
        self._ttl = ttl
        self._miss_ttl = miss_ttl
        self._clock = clock
        self._loaded: float | None = None
        """When the bucket was last read (None: never; not 0.0, which is "recent" on a fresh boot)."""
        self._by_name: dict[str, AgentDescriptor] = {}
        self._reading: asyncio.Task[None] | None = None

    async def _refresh(self, ttl: float | None = None) -> None:
        fresh = self._loaded is not None and self._clock() - self._loaded < (self._ttl if ttl is None else ttl)
        if fresh:
            return
        # One read for everyone who needs it now: while the broker does not answer, a hundred
        # handshakes wait out one timeout together, not a hundred timeouts in turn.
        if self._reading is None or self._reading.done():
            self._reading = asyncio.create_task(self._read())
        await asyncio.shield(self._reading)

    async def _read(self) -> None:
        try:
            self._by_name = await self._bus.kv_items(subjects.AGENTS_BUCKET, AgentDescriptor)
        except BusError:
            if self._loaded is None:
                raise
            # What was read before still names the agents: better than refusing everyone.
            log.warning("the agent directory could not be re-read; using the last copy")
            return
        self._loaded = self._clock()

    async def all(self, *, after_miss: bool = False) -> list[AgentDescriptor]:
        """Every agent, by name; `after_miss` when the caller did not find what it looked for."""
        await self._refresh(self._miss_ttl if after_miss else None)
        return [self._by_name[name] for name in sorted(self._by_name)]

    async def lookup(self, name: str) -> AgentDescriptor | None:
        """The agent `name`, or None when no dispatch serves it now."""
        await self._refresh()
        if name not in self._by_name:
            await self._refresh(self._miss_ttl)
        return self._by_name.get(name)

    async def by_path(self, path: str) -> AgentDescriptor | None:
        """The agent served at `path` (an `@ai_endpoint` path or `/atmosphere/agent/<name>`)."""
        await self._refresh()
        found = next((d for d in self._by_name.values() if d.path == path), None)
        if found is None:
            await self._refresh(self._miss_ttl)
            found = next((d for d in self._by_name.values() if d.path == path), None)
        return found
