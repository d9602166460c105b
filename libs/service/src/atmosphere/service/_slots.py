"""How many run streams a door follows at once: per client, and in total.

Every follower (a WebSocket run or resume, an SSE stream, a long-poll wait, a gRPC `Run` or
`Follow`) holds a live subscription and reads the run's stored events. Unbounded, one client
opening thousands of them takes what every other user's new runs need; so each client may hold
`per_client` of them and the process `total`, and a claim beyond either is refused at once
(the door answers 429 or `RESOURCE_EXHAUSTED`) instead of queued.

A client is an authenticated user, or an anonymous caller by network address (`client_key`):
without token grants every caller is anonymous, and one address must not starve the others.
"""

from __future__ import annotations

from typing import Literal

from atmosphere.contracts.common.v1.common_pb2 import Principal

Scope = Literal["client", "total"]


class StreamLimitError(Exception):
    """A stream beyond the client's share (`scope` "client") or beyond the process's (`total`)."""

    def __init__(self, scope: Scope, limit: int) -> None:
        """The `limit` of `scope` that was reached."""
        self.scope: Scope = scope
        self.limit = limit
        whose = "this client" if scope == "client" else "this server"
        super().__init__(f"{whose} already follows {limit} run streams at once")


def client_key(principal: Principal, address: str) -> str:
    """Whose share a stream counts against: the user, or an anonymous caller's address."""
    user = principal.user_id.strip()
    if user and user.lower() != "anonymous":
        return f"user:{user}"
    return f"anonymous@{address or 'unknown'}"


class StreamSlot:
    """One claimed stream; `release` gives it back (once, however often it is called)."""

    def __init__(self, slots: StreamSlots, client: str) -> None:
        self._slots = slots
        self._client = client
        self._held = True

    def release(self) -> None:
        """Give the slot back; later calls do nothing."""
        if self._held:
            self._held = False
            self._slots._give_back(self._client)

    def __enter__(self) -> StreamSlot:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


class StreamSlots:
    """The streams in use, per client and in total, within fixed limits."""

    def __init__(self, *, per_client: int, total: int) -> None:
        """At most `per_client` streams per client and `total` in all (both at least 1)."""
        if per_client < 1 or total < 1:
            msg = "stream limits must be at least 1"
            raise ValueError(msg)
        self.per_client = per_client
        self.total = total
        self._by_client: dict[str, int] = {}
        self._in_use = 0

    def claim(self, client: str) -> StreamSlot:
        """A slot for one more stream of `client`.

        Raises:
            StreamLimitError: `client` holds `per_client` streams, or the process `total`.
        """
        held = self._by_client.get(client, 0)
        if held >= self.per_client:
            raise StreamLimitError("client", self.per_client)
        if self._in_use >= self.total:
            raise StreamLimitError("total", self.total)
        self._by_client[client] = held + 1
        self._in_use += 1
        return StreamSlot(self, client)

    def in_use(self, client: str | None = None) -> int:
        """Streams held now, by `client` or by everyone."""
        return self._in_use if client is None else self._by_client.get(client, 0)

    def _give_back(self, client: str) -> None:
        held = self._by_client[client] - 1
        # Forgotten at zero: a million one-off clients leave no entries behind.
        if held:
            self._by_client[client] = held
        else:
            del self._by_client[client]
        self._in_use -= 1
