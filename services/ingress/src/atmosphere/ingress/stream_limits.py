"""Ingress's bound on run streams: each client's share and the process's total.

Every run ingress follows — a WebSocket run or resume, an SSE stream or resume, a long-poll
wait — holds a slot (`ATMOSPHERE_INGRESS__MAX_STREAMS_PER_CLIENT`, `…__MAX_STREAMS`) from
before the run is submitted or read until the stream ends, however it ends. A stream beyond a
limit is refused at once with `ingress.too_many_streams` (HTTP 429 with `Retry-After`, or an
error frame): one client's resumes use up its own share, never another user's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from fastapi import Request, WebSocket
from starlette.types import Receive, Scope, Send

from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.ingress.errors import TooManyStreamsError
from atmosphere.ingress.pacing import PacedResponse
from atmosphere.service import StreamLimitError, StreamSlot, StreamSlots, client_key

RETRY_AFTER = 5
"""Seconds a refused client is asked to wait: streams end, slots come back."""


def refusal(exc: StreamLimitError) -> TooManyStreamsError:
    """The answer to a stream beyond a limit, saying which one."""
    if exc.scope == "client":
        msg = f"Too many run streams open for this client (at most {exc.limit} at once); end one or try again later"
    else:
        msg = f"This server follows as many run streams as it takes ({exc.limit}); try again shortly"
    return TooManyStreamsError(msg, retry_after=RETRY_AFTER)


def address_of(connection: Request | WebSocket) -> str:
    """The client's network address (what an anonymous caller's share is keyed by)."""
    return connection.client.host if connection.client is not None else ""


def claim_stream(slots: StreamSlots, principal: Principal, address: str) -> StreamSlot:
    """A slot for one more stream of this caller, or `TooManyStreamsError`."""
    try:
        return slots.claim(client_key(principal, address))
    except StreamLimitError as exc:
        raise refusal(exc) from None


class HeldStreamResponse(PacedResponse):
    """An SSE response that gives its stream slot back once it is over, however it ended.

    Released around the whole ASGI call: the body's own `finally` never runs for a client that
    left before the first chunk, nor the response's close hooks when the server cancels it.
    """

    def __init__(
        self,
        content: AsyncIterator[bytes],
        *,
        slot: StreamSlot,
        keep_alive: float | None,
        draining: asyncio.Event,
        last_words: Callable[[], Awaitable[bytes]],
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """`PacedResponse`'s arguments and the `slot` it holds."""
        super().__init__(
            content,
            keep_alive=keep_alive,
            draining=draining,
            last_words=last_words,
            headers=headers,
        )
        self._slot = slot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the stream, then give the slot back."""
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._slot.release()
