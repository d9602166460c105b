"""A run's one event path: every event it writes, and its terminal event exactly once.

`EventOutput.emit` holds the answer's text until governance has seen it (`guard`, set at
admission when policies judge answers), then writes: nothing once another worker holds the run
(`fence`), nothing after the terminal event (counted as dropped), and before the terminal event
the run's `before_terminal` sequence (given at construction: the turn recorded, the run's end
reported), so the next run of the conversation finds both done. A re-driven run's events its
stream already holds go out no second time (`delivered`).

Each event is written once, by one call: a budget breach counted from a `usage` event, or a
block of the guard, ends the run from here with its error, written directly — never through
`emit` again.

A run that ends with an error logs one line as its error event goes out, `run <id> failed:
<code>` (`log_failed`): the code and nothing of the message, which may quote the user.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from atmosphere.bus.errors import BudgetExceededError, ResponseBlockedError, ServiceError
from atmosphere.bus.runs import TerminalGate, is_terminal
from atmosphere.contracts.common.v1.common_pb2 import Usage
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.dispatch.budget import BudgetMeter
from atmosphere.dispatch.durability import EventSink, Fence
from atmosphere.dispatch.output_guard import Blocked, OutputGuard
from atmosphere.dispatch.resume import DeliveredEvents
from atmosphere.dispatch.run_telemetry import RunTelemetry

BeforeTerminal = Callable[[RunEvent], Awaitable[None]]

log = logging.getLogger("atmosphere.dispatch")


def log_failed(run_id: str, code: str, *, level: int = logging.WARNING, why: str = "") -> None:
    """The one line a failed run logs: `run <id> failed: <code>`, and `why` (words of ours, never the user's)."""
    if why:
        log.log(level, "run %s failed: %s (%s)", run_id, code, why)
    else:
        log.log(level, "run %s failed: %s", run_id, code)


class EventOutput:
    """The events of one run, from its steps (and its session) to its stream."""

    def __init__(
        self,
        run_id: str,
        sink: EventSink,
        *,
        before_terminal: BeforeTerminal | None,
        stop: Callable[[], None],
        meter: BudgetMeter | None = None,
        delivered: DeliveredEvents | None = None,
        fence: Fence | None = None,
        observer: RunTelemetry | None = None,
    ) -> None:
        """Write to `sink`; `stop` stops the model call under way when the run ends from here.

        `observer` sees the answer's text deltas, the usage and the terminal event as they go out.
        """
        self.sink = sink
        self._before_terminal = before_terminal
        self._stop = stop
        self._meter = meter
        self._delivered = delivered
        self._fence = fence
        self._observer = observer
        self._run_id = run_id
        self._gate = TerminalGate(run_id)
        self.guard: OutputGuard | None = None
        """Holds the answer until governance has checked it (set at admission when policies judge answers)."""
        self.answer: list[str] = []
        """The answer's text so far (a sub-agent's forwarded text is not part of it)."""
        self.usage: list[Usage] = []
        """Every usage event of the run (governance prices them when it ends)."""
        self.succeeded = False
        """Whether the terminal event was `complete`."""
        self.breached = False
        """Whether the run ended on its budget or a blocked answer (no post-processing then)."""

    @property
    def closed(self) -> bool:
        """Whether the terminal event was written."""
        return self._gate.closed

    @property
    def dropped(self) -> int:
        """How many events arrived after the terminal one and were dropped."""
        return self._gate.dropped

    async def emit(self, event: RunEvent) -> None:
        """Write `event` — the answer's text once governance has seen it (`guard`), see `_write`."""
        guard = self.guard
        if guard is None or self._gate.closed or event.origin_run_id:
            breach = await self._write(event)
        else:
            breach = await self._guarded(guard, event)
        if breach is not None:
            await self._end(breach)

    async def fail(self, error: ServiceError) -> None:
        """End the run with `error` as its terminal event."""
        await self.emit(RunEvent(error=error.to_proto()))

    async def trip(self, breach: BudgetExceededError) -> None:
        """End the run with the budget's error and stop the model call under way."""
        await self._end(breach)

    async def _guarded(self, guard: OutputGuard, event: RunEvent) -> BudgetExceededError | None:
        kind = event.WhichOneof("kind")
        try:
            if kind == "text_delta":
                released = await guard.text(event)
            elif kind == "text_complete":
                released = await guard.whole_text(event.text_complete.full_text)
            elif kind == "error":
                # The run fails anyway: held text nobody checked is dropped, never sent unchecked.
                guard.discard()
                released = []
            else:
                released = await guard.before(final=kind == "complete")
        except Blocked as blocked:
            # `Response blocked: …`; nothing of the answer after it goes anywhere.
            details = {"policy": blocked.policy, "reason": blocked.detail} if blocked.policy else {}
            await self._end(ResponseBlockedError(blocked.reason, details=details))
            return None
        for piece in released:
            await self._write(piece)
        if kind != "text_delta":
            return await self._write(event)
        return None

    async def _end(self, error: ServiceError) -> None:
        """End the run from here with `error` (a breach, a block) and stop the model call under way."""
        self.breached = True  # no post-processing of an answer the client never got (whole)
        if self.guard is not None and not self._gate.closed:
            self.guard.discard()
        await self._write(RunEvent(error=error.to_proto()))
        self._stop()

    async def _write(self, event: RunEvent) -> BudgetExceededError | None:
        """Write `event`: the terminal one once, `before_terminal` first; a usage's breach is returned.

        A re-driven run holds back what its stream already has (`delivered`); a run another
        worker took over writes nothing more (`fence`).
        """
        if self._fence is not None and not await self._fence():
            return None
        if not self._gate.admit(event):
            return None
        kind = event.WhichOneof("kind")
        terminal = is_terminal(event)
        if terminal:
            self.succeeded = kind == "complete"
            if self._before_terminal is not None:
                await self._before_terminal(event)
        for outgoing in [event] if self._delivered is None else self._delivered.admit(event):
            await self.sink.emit(outgoing)
        if kind == "error":  # terminal: admitted once
            log_failed(self._run_id, event.error.code)
        observer = self._observer
        if kind == "text_delta" and not event.origin_run_id:  # a sub-agent's text is not the answer
            self.answer.append(event.text_delta.text)
            if observer is not None:
                observer.text()
        elif kind == "usage":
            self.usage.append(event.usage)
            if observer is not None:
                observer.usage(event.usage)
            if self._meter is not None and not self.breached:
                return self._meter.add(event.usage)
        elif terminal and observer is not None:
            observer.ended(event)
        return None
