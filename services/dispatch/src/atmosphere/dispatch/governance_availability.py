"""Whether governance answers, as this dispatch's own questions find it, and asking accordingly.

Why it matters: with no governance replica serving, each question used to be retried until its
deadline (`ATMOSPHERE_DISPATCH__GOVERNANCE_TIMEOUT`, 5 s) before its run was refused. Every run
of an outage held a dispatch slot that long, the run queue backed up behind them, and once
governance was back new runs waited behind that backlog; questions asleep in a backoff noticed
only when they woke.

So an outage starts when a question gets no answer (nobody serves, or nobody replied in time)
and ends the moment any question gets one — every question waiting to try again is woken then.
A question asked when the outage is already older than its own deadline gets one attempt (that
is how the end of an outage is noticed) and is refused at once if nobody answers it: what the
retries ride out (a replica restarting, a broker electing a leader) does not take that long, and
waiting again would only hold the run's slot. Refusals stay fail-closed, with the same errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TypeVar

from google.protobuf.message import Message

from atmosphere.bus import Bus, BusError, RemoteError
from atmosphere.bus.errors import ConnectionLostError, DecodeError, NoStreamError, PayloadTooLargeError

M = TypeVar("M", bound=Message)

FIRST_RETRY = 0.05
"""Seconds before the first retry of a question nobody answered; doubling up to `MAX_RETRY_WAIT`."""
MAX_RETRY_WAIT = 0.5
"""The longest wait between two tries (a wait ends early the moment governance answers anyone)."""
FINAL = (DecodeError, PayloadTooLargeError, NoStreamError, ConnectionLostError)
"""Failures a second try cannot cure: what was sent or what came back cannot be used, or the
connection is gone for good."""


class Availability:
    """How long governance has been silent to this dispatch (0: it answers); wakes waiters when it answers."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        """Start as answering; `clock` is monotonic seconds."""
        self._clock = clock
        self._silent_since: float | None = None
        self._answering = asyncio.Event()
        self._answering.set()

    def answered(self) -> None:
        """A question got an answer (any, a refusal included): an outage, if any, is over."""
        self._silent_since = None
        self._answering.set()

    def silent(self, since: float) -> None:
        """A question asked at `since` (on `clock`) got no answer: an outage starts then.

        Unless one is already going on. From the question's start: the silence covers its whole
        wait, not only its end (else a run asked one deadline later could retry for another).
        """
        if self._silent_since is None:
            self._silent_since = since
            self._answering.clear()

    def now(self) -> float:
        """The time on this availability's clock."""
        return self._clock()

    def silent_for(self) -> float:
        """Seconds since governance last left a question unanswered with none answered since (0: answering)."""
        return 0.0 if self._silent_since is None else max(0.0, self._clock() - self._silent_since)

    async def until_answering(self, timeout: float) -> None:
        """Wait `timeout` seconds, or less: until a question gets an answer."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._answering.wait(), timeout)


async def ask(
    bus: Bus,
    availability: Availability,
    subject: str,
    message: Message,
    reply_type: type[M],
    *,
    deadline: float,
    retry: bool = True,
) -> M:
    """`bus.request` to governance, tried again until `deadline` seconds have passed (with `retry`).

    Tried again: no answer (nobody serves, nobody replied in time) and an answer that says the
    same request may succeed if sent again (a replica still catching up). An outage older than
    `deadline` gets one try. Only for questions that are safe to repeat.

    Raises:
        BusError: the last try's failure (an answer that refuses, or no answer by the deadline).
    """
    give_up = time.monotonic() + deadline
    retry = retry and availability.silent_for() < deadline
    wait = FIRST_RETRY
    while True:
        remaining = give_up - time.monotonic()
        asked, session = availability.now(), bus.epoch
        try:
            reply = await bus.request(subject, message, reply_type, timeout=max(0.1, remaining))
        except RemoteError as exc:
            availability.answered()
            if not (retry and exc.error.retryable) or give_up - time.monotonic() <= wait:
                raise
            await asyncio.sleep(wait)  # governance answers; this replica is not ready for it yet
        except FINAL:
            raise
        except BusError:
            if bus.is_connected and bus.epoch == session:
                # Only silence on a connection that lived through the question says anything of
                # governance: a broker restart is no governance outage, and must not make the
                # first runs after it refused at once while governance reconnects.
                availability.silent(since=asked)
            if not retry or give_up - time.monotonic() <= FIRST_RETRY:
                raise
            await availability.until_answering(min(wait, max(0.0, give_up - time.monotonic())))
        else:
            availability.answered()
            return reply
        wait = min(MAX_RETRY_WAIT, wait * 2)
