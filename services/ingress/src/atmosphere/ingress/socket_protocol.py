"""uvicorn's sans-I/O WebSocket protocol, holding less for as long as a socket stays open.

What uvicorn keeps per socket that an open one never uses again, measured with tracemalloc on
2,000 idle sockets (`bench/ingress_overhead.py`'s idle arm):

- the queue of received messages and the "writable" event: an `asyncio.Queue` and an
  `asyncio.Event`, about 4 KiB of empty deques; here a `Mailbox` and a `Flag` (`mailbox.py`);
- the handshake's request and response, with their headers (about 3 KiB): read once, at the
  handshake, and kept until the socket closes (uvicorn keeps both; websockets' parser keeps the
  request as a local of its generator); here emptied and let go once the handshake is done.

Everything else is uvicorn's own, unchanged. Built for the uvicorn versions `pyproject.toml`
allows (`limits.py` subclasses its HTTP protocol likewise); `test_socket_protocol.py` checks
each of the above on the real server.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.http11 import Request

from atmosphere.ingress.mailbox import Flag, Mailbox

__all__ = ["LeanSocketProtocol"]


class LeanSocketProtocol(WebSocketsSansIOProtocol):
    """`WebSocketsSansIOProtocol` with lean per-socket state (see the module's docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Duck-typed stand-ins: uvicorn calls put_nowait/get/empty and set/clear/wait only.
        self.queue = Mailbox()  # type: ignore[assignment]
        self.writable = Flag(value=True)  # type: ignore[assignment]

    def handle_connect(self, event: Request) -> None:
        """Answer the handshake; its request is in the ASGI scope by now, never read again."""
        super().handle_connect(event)
        # Emptied, not only dropped: websockets' parser holds the request until the socket closes.
        event.headers.clear()
        self.request = None  # type: ignore[assignment]

    def start_keepalive(self) -> None:
        """Start the pings; called once, right after the accepted handshake's response is written."""
        self.response = None  # type: ignore[assignment]
        super().start_keepalive()
