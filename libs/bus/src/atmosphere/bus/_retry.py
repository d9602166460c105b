"""Idempotent requests that ride out a broker restart instead of failing at the first blip."""

from __future__ import annotations

import asyncio
import time
from typing import TypeVar

from google.protobuf.message import Message

from atmosphere.bus._api import Bus
from atmosphere.bus._codec import Headers
from atmosphere.bus.errors import (
    BusError,
    ConnectionLostError,
    DecodeError,
    NoRespondersError,
    NoStreamError,
    PayloadTooLargeError,
    RemoteError,
    ServiceError,
)

M = TypeVar("M", bound=Message)

FINAL_ERRORS = (RemoteError, DecodeError, PayloadTooLargeError, ConnectionLostError, NoStreamError)
"""Errors a second attempt cannot cure: the responder answered, nothing can be sent, or no
stream is there to take it."""
MAX_WAIT = 1.0
"""The longest wait between two attempts."""
MAX_WAIT_FOR_RESPONDERS = 0.25
"""... when nobody served the subject: the broker says so at once, so asking again is cheap,
and a responder that came back is found within this (not a whole `MAX_WAIT` later)."""


async def request_retrying(
    bus: Bus,
    subject: str,
    message: Message,
    reply_type: type[M],
    *,
    deadline: float,
    headers: Headers | None = None,
    attempt_timeout: float | None = None,
    answers: tuple[type[ServiceError], ...] = (),
) -> M:
    """`bus.request`, tried again (with backoff) until `deadline` seconds have passed.

    Only for requests that are safe to repeat (a check, a read, a write with an idempotency
    key): a reconnecting client, a responder that is restarting, a request lost with a dead
    connection, or an `Error` marked retryable is tried again; any other answer is final.

    `answers` are retryable errors the caller handles itself (retrying means something else
    there, e.g. starting a paged read over). `attempt_timeout` bounds one attempt: a request
    lost with a responder killed mid-way is then sent again before the deadline (to a replica
    that is alive) instead of waiting it out.

    Raises:
        BusError: the last attempt's error once the deadline has passed (or a final one at once).
    """
    give_up = time.monotonic() + deadline
    attempt = 0
    while True:
        remaining = give_up - time.monotonic()
        longest = MAX_WAIT
        try:
            timeout = remaining if attempt_timeout is None else min(attempt_timeout, remaining)
            return await bus.request(subject, message, reply_type, timeout=max(0.1, timeout), headers=headers)
        except RemoteError as exc:
            # An answer is final, unless the responder says the same request may succeed if
            # sent again (a replica still catching up, a store that did not take a write).
            if not exc.error.retryable or isinstance(exc.error, answers) or give_up - time.monotonic() <= 0.05:
                raise
        except FINAL_ERRORS:
            raise
        except BusError as exc:
            if give_up - time.monotonic() <= 0.05:
                raise
            longest = MAX_WAIT_FOR_RESPONDERS if isinstance(exc, NoRespondersError) else MAX_WAIT
        await asyncio.sleep(min(longest, 0.05 * 2**attempt, max(0.0, give_up - time.monotonic())))
        attempt += 1
