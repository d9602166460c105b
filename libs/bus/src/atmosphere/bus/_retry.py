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
    NoStreamError,
    PayloadTooLargeError,
    RemoteError,
)

M = TypeVar("M", bound=Message)

FINAL_ERRORS = (RemoteError, DecodeError, PayloadTooLargeError, ConnectionLostError, NoStreamError)
"""Errors a second attempt cannot cure: the responder answered, nothing can be sent, or no
stream is there to take it."""


async def request_retrying(
    bus: Bus,
    subject: str,
    message: Message,
    reply_type: type[M],
    *,
    deadline: float,
    headers: Headers | None = None,
) -> M:
    """`bus.request`, tried again (with backoff) until `deadline` seconds have passed.

    Only for requests that are safe to repeat (a check, a read): a reconnecting client, a
    responder that is restarting, or a request lost with a dead connection is tried again;
    an answer, even an `Error`, is final.

    Raises:
        BusError: the last attempt's error once the deadline has passed (or a final one at once).
    """
    give_up = time.monotonic() + deadline
    attempt = 0
    while True:
        remaining = give_up - time.monotonic()
        try:
            return await bus.request(subject, message, reply_type, timeout=max(0.1, remaining), headers=headers)
        except FINAL_ERRORS:
            raise
        except BusError:
            if give_up - time.monotonic() <= 0.05:
                raise
        await asyncio.sleep(min(1.0, 0.05 * 2**attempt, max(0.0, give_up - time.monotonic())))
        attempt += 1
