"""How a run survives its worker: chosen once per run, so its steps never ask which mode they are in.

- `Live`: nothing journaled (`RunExecutor.execute`, a bare in-process run).
- `Journaled`: a run off the work queue. Every effect of a durable run (committed ones replay),
  or only its tool calls' start markers; its writes are fenced by the journal's lease, so a
  worker whose run another one took over writes, calls and records nothing more.
- `Replaying`: an ended run re-driven from its journal alone (`RunExecutor.replay`): events go
  to a capture, and nothing reaches any service — no admission, memory, interceptor,
  governance accounting or sandbox session.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from atmosphere.bus import Bus
from atmosphere.bus.runs import RunEventWriter
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, RunSubmission
from atmosphere.dispatch.control import RunControl
from atmosphere.dispatch.effects import RunEffects
from atmosphere.dispatch.journal import RunJournal
from atmosphere.dispatch.resume import CapturedEvents
from atmosphere.dispatch.run_scope import RunScope

LEASE_CHECK_INTERVAL = 1.0
"""Seconds between a run's checks that no other worker took it over while it writes events. The
first comes this long after the worker took the run: before that nobody else can hold it (a run
is redelivered only after the ack wait, several seconds), so a short run asks nothing."""

Fence = Callable[[], Awaitable[bool]]
"""Asked before each event is written: whether this worker still holds the run."""


class EventSink(Protocol):
    """Where a run's events go: its stream (`RunEventWriter`) or a replay's capture."""

    async def emit(self, event: RunEvent, *, durable: bool | None = None) -> RunEvent:
        """Write `event`."""
        ...

    async def close(self) -> None:
        """Flush what is in flight."""
        ...


class Durability(Protocol):
    """One run's durability: where its events go, its journal's handles, its fence, its end."""

    @property
    def reaches_services(self) -> bool:
        """Whether the run's steps reach other services (all but a replay)."""
        ...

    @property
    def lost(self) -> bool:
        """Whether another worker took the run over: this one writes, calls and records nothing more."""
        ...

    def sink(self, bus: Bus, request: RunSubmission, first_seq: int) -> EventSink:
        """Where the run's events go."""
        ...

    def effects(self, scope: RunScope) -> RunEffects | None:
        """The journal's handles for the run's effects; None when nothing is journaled."""
        ...

    def fence(self, on_lost: Callable[[], None]) -> Fence | None:
        """What each write asks first (None: nothing; `on_lost` once the run is found taken over)."""
        ...

    def serving(self, bus: Bus, control: RunControl) -> AbstractAsyncContextManager[object]:
        """The run's control subject, served while the agent runs (a replay serves none)."""
        ...

    async def close(self, *, succeeded: bool, retain: bool) -> None:
        """The run ended: its journal, if any, is closed as its mode says."""
        ...


class Live:
    """A run nothing is journaled for."""

    reaches_services = True
    lost = False

    def sink(self, bus: Bus, request: RunSubmission, first_seq: int) -> EventSink:
        """The run's stream."""
        return RunEventWriter(bus, request, first_seq=first_seq)

    def effects(self, scope: RunScope) -> RunEffects | None:
        """Nothing journaled."""
        del scope
        return None

    def fence(self, on_lost: Callable[[], None]) -> Fence | None:
        """Nobody else can hold the run."""
        del on_lost
        return None

    def serving(self, bus: Bus, control: RunControl) -> AbstractAsyncContextManager[object]:
        """The run's control subject."""
        return serve_control(bus, control)

    async def close(self, *, succeeded: bool, retain: bool) -> None:
        """Nothing to close."""


class Journaled:
    """A run off the work queue: its journal, its lease checked about once a second while it writes."""

    reaches_services = True

    def __init__(self, journal: RunJournal, *, durable: bool, taken_at: float | None = None) -> None:
        """Journal every effect (`durable`) or only tool calls' starts; `taken_at`: when the worker took the run."""
        self.journal = journal
        self.durable = durable
        self._next_check = (time.monotonic() if taken_at is None else taken_at) + LEASE_CHECK_INTERVAL

    @property
    def lost(self) -> bool:
        """Whether another worker took the run over."""
        return self.journal.lost

    def sink(self, bus: Bus, request: RunSubmission, first_seq: int) -> EventSink:
        """The run's stream."""
        return RunEventWriter(bus, request, first_seq=first_seq)

    def serving(self, bus: Bus, control: RunControl) -> AbstractAsyncContextManager[object]:
        """The run's control subject."""
        return serve_control(bus, control)

    def effects(self, scope: RunScope) -> RunEffects | None:
        """Every effect of a durable run; otherwise only its tool calls' starts."""
        return _effects(self.journal, scope, tools_only=not self.durable)

    def fence(self, on_lost: Callable[[], None]) -> Fence | None:
        """Whether this worker still holds the run (its journal asked at most once a second).

        Once it does not, `on_lost` stops the model call under way: nothing it would say or
        call is this worker's any more.
        """

        async def held() -> bool:
            if self.journal.lost:
                return False
            now = time.monotonic()
            if now >= self._next_check:
                self._next_check = now + LEASE_CHECK_INTERVAL
                if not await self.journal.still_held():
                    on_lost()
                    return False
            return True

        return held

    async def close(self, *, succeeded: bool, retain: bool) -> None:
        """Remove the journal or close it with a terminal record (`RunJournal.close`)."""
        await self.journal.close(succeeded=succeeded, retain=retain)


class Replaying:
    """An ended run re-driven from its (read-only) journal into a capture."""

    reaches_services = False

    def __init__(self, journal: RunJournal, capture: CapturedEvents) -> None:
        """Replay `journal`'s committed effects; the events go to `capture`."""
        self.journal = journal
        self.capture = capture

    @property
    def lost(self) -> bool:
        """Never: nobody else writes a replay's capture."""
        return self.journal.lost

    def sink(self, bus: Bus, request: RunSubmission, first_seq: int) -> EventSink:
        """The capture."""
        del bus, request, first_seq
        return self.capture

    def effects(self, scope: RunScope) -> RunEffects | None:
        """Every effect: a step the journal lacks ends the replay (`ReplayDivergedError`)."""
        return _effects(self.journal, scope, tools_only=False)

    def fence(self, on_lost: Callable[[], None]) -> Fence | None:
        """Nothing to fence: a replay writes no stream."""
        del on_lost
        return None

    def serving(self, bus: Bus, control: RunControl) -> AbstractAsyncContextManager[object]:
        """No control subject: nobody can reach a replay."""
        del bus, control
        return contextlib.nullcontext()

    async def close(self, *, succeeded: bool, retain: bool) -> None:
        """The replayed journal stays as it was."""


def _effects(journal: RunJournal, scope: RunScope, *, tools_only: bool) -> RunEffects:
    return RunEffects(
        journal,
        user_id=scope.request.principal.user_id,
        model=scope.model,
        tool_names=scope.agent.tools,
        tools_only=tools_only,
    )


def serve_control(bus: Bus, control: RunControl) -> AbstractAsyncContextManager[object]:
    """Serve the run's control subject while the run runs.

    One handler (a control message is answered at once, and is rare), and not confirmed: a
    client controls a run it has seen run, and every event the run writes is published after
    the subscription on the worker's connection, so the broker had it first (its confirmation
    was two round trips a run).
    """
    return bus.serve(control.router(), max_inflight=1, confirmed=False)
