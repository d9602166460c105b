"""What a run's agent runs on and where it is served: from its descriptor in `ATMO_AGENTS`.

Run events name their agent but not its runtime or endpoint path; the tape looks the agent up
when it first sees a run. Answers are kept for `refresh` seconds, so the record path asks the
bus about an agent at most that often (and never per event); an agent the bucket does not hold,
or a bucket that cannot be read, is an empty answer, never a failed batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from atmosphere.bus import Bus, subjects
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor

log = logging.getLogger("atmosphere.tape")

LOOKUP_TIMEOUT = 1.0
"""Seconds one look-up may hold up recording."""

MAX_AGENTS = 4096
"""Agents remembered at most (the names come from events: any number could appear)."""


@dataclass(frozen=True, slots=True)
class AgentFacts:
    """An agent's runtime and endpoint path ("" when unknown)."""

    runtime: str = ""
    endpoint: str = ""


UNKNOWN = AgentFacts()


class AgentDirectory:
    """Agent facts from `ATMO_AGENTS`, remembered for a while."""

    def __init__(self, bus: Bus | None, *, refresh: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        """Read from `bus` (None: every agent is unknown), each answer kept `refresh` seconds."""
        self._bus = bus
        self._refresh = refresh
        self._clock = clock
        self._known: dict[str, tuple[AgentFacts, float]] = {}

    async def facts(self, agent: str) -> AgentFacts:
        """What `ATMO_AGENTS` says of `agent`."""
        if self._bus is None or not agent:
            return UNKNOWN
        now = self._clock()
        known = self._known.get(agent)
        if known is not None and now - known[1] < self._refresh:
            return known[0]
        try:
            async with asyncio.timeout(LOOKUP_TIMEOUT):
                descriptor = await self._bus.kv_get(subjects.AGENTS_BUCKET, agent, AgentDescriptor)
        except Exception as exc:  # a missing bucket, a bus failure: the run is recorded without them
            log.debug("agent %r: no descriptor (%s)", agent[:128], exc)
            descriptor = None
        facts = UNKNOWN if descriptor is None else AgentFacts(descriptor.runtime, descriptor.path)
        if len(self._known) >= MAX_AGENTS:
            self._known.clear()
        self._known[agent] = (facts, now)
        return facts
