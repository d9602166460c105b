"""A run's text deltas joined when the model streams faster than a window: fewer events, same text.

Every event of a run costs the same wherever it goes — a bus message, a JetStream store, a tape
row, a client frame — whether it carries one character or a thousand. A model that streams
faster than a reader can use its deltas (hundreds of tokens a second, or a backlog read at once)
pays that cost per token for nothing. `CoalescedEvents` sits in front of the run's stream:

- a text delta goes out at once when none went out within the last `window` seconds — the
  first delta of a run always does, and so does every delta of a model slower than the window;
- later ones are held and joined into one delta, sent when the window since the last one ends
  (a timer), when `max_chars` are held, or right before any other event (the order of events
  never changes: text held is always older than the event that flushes it).

Only the run's own answer text is joined (a sub-agent's forwarded text goes through as it is).
The text is the same string either way, so what counts it downstream — a resumed run's
delivered text, the output guard (which releases text before it reaches here), the journal —
stays exact: a delta held when a worker dies never reached the stream, and the re-drive sends it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from atmosphere.bus.errors import BusError
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, TextDelta

if TYPE_CHECKING:
    from atmosphere.dispatch.durability import EventSink

log = logging.getLogger("atmosphere.dispatch")

DEFAULT_WINDOW = 0.005
"""Seconds (5 ms) within which later text deltas are joined; 0 sends each one as it comes."""

DEFAULT_MAX_CHARS = 1024
"""Characters held at most before they go out, whatever the window."""


class CoalescedEvents:
    """An `EventSink` that joins a run's own text deltas within a window (see the module)."""

    def __init__(self, sink: EventSink, *, window: float = DEFAULT_WINDOW, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        """Write to `sink`, joining text deltas that come less than `window` seconds after the last one sent.

        Made inside the run's event loop (its timers are that loop's).
        """
        self._sink = sink
        self._window = window
        self._max_chars = max_chars
        self._held: list[str] = []
        self._held_chars = 0
        self._sent_at = float("-inf")
        """When the last text delta went out (the loop's clock)."""
        self._timer: asyncio.TimerHandle | None = None
        self._flushing: asyncio.Task[None] | None = None
        """The timer's flush, under way: every later write waits for it (order)."""
        self._loop = asyncio.get_running_loop()

    @property
    def held(self) -> str:
        """The text held, not yet written."""
        return "".join(self._held)

    async def emit(self, event: RunEvent, *, durable: bool | None = None) -> RunEvent:
        """Write `event`: a text delta perhaps joined with the next ones, anything else after the held text."""
        if self._flushing is not None:
            await self._after_timer_flush()
        if event.WhichOneof("kind") == "text_delta" and not event.origin_run_id and not durable:
            # Inline, not a helper: this is every token's path.
            now = self._loop.time()
            if not self._held and now - self._sent_at >= self._window:
                self._sent_at = now
                return await self._sink.emit(event)
            text = event.text_delta.text
            self._held.append(text)
            self._held_chars += len(text)
            if self._held_chars >= self._max_chars:
                await self._flush()
            elif self._timer is None:
                self._timer = self._loop.call_at(self._sent_at + self._window, self._on_timer)
            return event
        await self._flush()
        return await self._sink.emit(event, durable=durable)

    async def close(self) -> None:
        """Write what is held (a run that ends without a terminal event), then close the sink."""
        try:
            if self._flushing is not None:
                await self._after_timer_flush()
            await self._flush()
        except BusError as exc:
            # Never raised from here (a `finally`): a run that could not store its events is
            # re-driven, and the re-drive sends whatever the stream lacks.
            log.warning("run events: the last held text could not be written: %s", exc)
        finally:
            await self._sink.close()

    async def _flush(self) -> None:
        """Write the held text as one delta (nothing when nothing is held)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._held:
            return
        joined = RunEvent(text_delta=TextDelta(text="".join(self._held)))
        self._held.clear()
        self._held_chars = 0
        self._sent_at = self._loop.time()
        await self._sink.emit(joined)

    def _on_timer(self) -> None:
        self._timer = None
        if self._held and self._flushing is None:
            self._flushing = asyncio.create_task(self._flush(), name="coalesced-text")

    async def _after_timer_flush(self) -> None:
        flushing, self._flushing = self._flushing, None
        if flushing is not None:
            await flushing


__all__ = ["DEFAULT_MAX_CHARS", "DEFAULT_WINDOW", "CoalescedEvents"]
