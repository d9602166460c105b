"""A run's answer held back until governance has seen it: streamed output checked as it streams.

Atmosphere checks the accumulated answer every 200 new characters and at the end, and a trip
ends the stream with `Response blocked: …` — but what streamed before the trip has already gone
out, so an email split across two checks reaches the client. Here the answer's text is held
until a check that covers it has passed: a check runs every `CHECK_EVERY` new characters, the
last `HOLD_BACK` characters of what it saw stay held (a match may be completed by what comes
next: an email's local part is harmless alone), and the rest is released up to a whitespace (no
word is split, so no pattern is released in part). Any other event of the run (a tool call, the
terminal event) first has the held text checked and released, so order is kept. The final check
runs before `complete` and sees the whole answer.

Cost: a run whose policies do not judge answers (governance says so at admission) has no guard
at all; otherwise one bus round trip per 200 characters, and the client sees text in bursts.
A check governance does not answer stops the answer (fail-closed).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable

from atmosphere.bus import BusError
from atmosphere.contracts.governance.v1.governance_pb2 import Decision
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, TextDelta
from atmosphere.dispatch.governance_client import CHECK_WINDOW, OUTPUT_UNAVAILABLE, RESPONSE_BLOCKED

log = logging.getLogger("atmosphere.dispatch")

CHECK_EVERY = 200
"""New characters between two checks of a streaming answer (Atmosphere's interval)."""
HOLD_BACK = 64
"""Characters at the end of a checked answer kept back until the next check sees what follows."""
MAX_UNBROKEN = 4 * CHECK_EVERY
"""Checked text held for want of a whitespace beyond this is released anyway (e.g. base64)."""

Check = Callable[[str, int, bool], Awaitable[Decision]]
"""Governance's decision on the answer so far: its tail (at least `CHECK_WINDOW` characters when it
is that long), its whole length, and whether it is final (before `complete`)."""


class Blocked(Exception):  # noqa: N818 - a stop, not a failure
    """The answer may not go on; `reason` is the client's `Response blocked: …` text."""

    def __init__(self, reason: str, *, policy: str = "", detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.policy = policy
        self.detail = detail


class OutputGuard:
    """Holds a run's own text events until a passing check covers them."""

    def __init__(self, check: Check, *, run_id: str, every: int = CHECK_EVERY, hold_back: int = HOLD_BACK) -> None:
        self._check = check
        self._run_id = run_id
        self._every = every
        self._hold_back = hold_back
        # Only the tail is kept, as pieces joined when a check needs it (every 200 characters, not
        # per delta): a check sends the last CHECK_WINDOW characters, and what is not yet
        # released is in the held events.
        self._pieces: list[str] = []
        self._length = 0
        self._checked = 0
        self._released = 0
        self._held: deque[RunEvent] = deque()
        self.checks = 0
        """Checks asked so far."""

    @property
    def held_chars(self) -> int:
        """Characters of the answer not released yet."""
        return self._length - self._released

    async def text(self, event: RunEvent) -> list[RunEvent]:
        """Take one of the run's own text events; the text events that may go out now.

        Raises:
            Blocked: the answer so far may not reach the client.
        """
        self._append(event.text_delta.text)
        self._held.append(event)
        if self._length - self._checked < self._every:
            return []
        await self._judge(final=False)
        return self._release(self._safe_end())

    async def before(self, *, final: bool) -> list[RunEvent]:
        """Before another event of the run: check what is held (all of it at `final`) and release it.

        Raises:
            Blocked: the answer may not reach the client.
        """
        if final or self._checked < self._length:
            await self._judge(final=final)
        return self._release(self._length)

    async def whole_text(self, text: str) -> list[RunEvent]:
        """Check a round's whole text (`text_complete`) unless the answer already ends with it.

        Returns the held text events released by the check of what came before it: they go out
        ahead of the `text_complete` (dropped, the streamed answer would lose its end).

        Raises:
            Blocked: it may not reach the client.
        """
        released = await self.before(final=False)
        if text and not self._tail().endswith(text):
            self.checks += 1
            whole = (self._tail() + text)[-max(CHECK_WINDOW, len(text)) :]
            try:
                decision = await self._check(whole, self._length + len(text), False)
            except BusError as exc:
                raise Blocked(OUTPUT_UNAVAILABLE) from exc
            if not decision.allowed:
                raise Blocked(RESPONSE_BLOCKED + decision.reason, policy=decision.policy, detail=decision.reason)
        return released

    def discard(self) -> int:
        """Drop what is held unreleased (the run ends otherwise); how many characters went."""
        dropped = self.held_chars
        self._held.clear()
        self._released = self._length
        return dropped

    async def _judge(self, *, final: bool) -> None:
        self.checks += 1
        try:
            decision = await self._check(self._tail(), self._length, final)
        except BusError as exc:
            log.warning("run %s: governance did not check the answer (%s); stopping it", self._run_id, exc)
            raise Blocked(OUTPUT_UNAVAILABLE) from exc
        if not decision.allowed:
            policy = decision.policy or "default"
            log.info("run %s: answer stopped by policy %s: %s", self._run_id, policy, decision.reason)
            raise Blocked(RESPONSE_BLOCKED + decision.reason, policy=policy, detail=decision.reason)
        self._checked = self._length

    def _append(self, text: str) -> None:
        self._length += len(text)
        self._pieces.append(text)

    def _tail(self) -> str:
        """The answer's last `CHECK_WINDOW` characters (or all of it), kept as the one piece."""
        tail = "".join(self._pieces)[-CHECK_WINDOW:]
        self._pieces = [tail]
        return tail

    def _safe_end(self) -> int:
        """Where released text may end after a passing check: before the hold-back, at a whitespace."""
        end = self._checked - self._hold_back
        if end <= self._released:
            return self._released
        window = "".join(e.text_delta.text for e in self._held)[: end - self._released]
        cut = max(window.rfind(" "), window.rfind("\n"), window.rfind("\t"))
        if cut >= 0:
            return self._released + cut + 1
        return end if end - self._released > MAX_UNBROKEN else self._released

    def _release(self, end: int) -> list[RunEvent]:
        """The held events covering the answer up to `end`, the last one split if `end` falls inside it."""
        out: list[RunEvent] = []
        while self._held and self._released < end:
            event = self._held[0]
            text = event.text_delta.text
            room = end - self._released
            if len(text) <= room:
                out.append(self._held.popleft())
                self._released += len(text)
                continue
            head = RunEvent()
            head.CopyFrom(event)
            head.text_delta.CopyFrom(TextDelta(text=text[:room]))
            event.text_delta.text = text[room:]
            out.append(head)
            self._released += room
        return out
