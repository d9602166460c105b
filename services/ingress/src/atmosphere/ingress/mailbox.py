"""Waitable per-connection state that costs next to nothing while a connection is idle.

An open WebSocket keeps two queues (the frames the server received, the frames its runs send)
and a "writable" flag for as long as it is open, mostly idle. `asyncio.Queue` allocates four
deques up front (about 3 KiB) and `asyncio.Event` one (760 bytes): at 10,000 idle sockets that
is 70 MiB of empty buffers. These hold a list and one waiter, made when first needed.

Both are for one event loop; a `Mailbox` has one reader at a time (every queue they replace does).
"""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

__all__ = ["Flag", "Mailbox"]

T = TypeVar("T")


class Mailbox(Generic[T]):
    """An unbounded FIFO with one reader: `put_nowait` never blocks, `get` waits for an item.

    Bounds are its users' own (a connection closes a client too slow for its frames; uvicorn
    stops reading a socket whose message is not read yet), as they were with `asyncio.Queue`.
    A list, not a deque: it is nearly always empty or holds a few items, and an empty list is
    56 bytes where an empty deque is 760.
    """

    __slots__ = ("_items", "_reader")

    def __init__(self) -> None:
        self._items: list[T] = []
        self._reader: asyncio.Future[None] | None = None

    def put_nowait(self, item: T) -> None:
        """Append `item`; the reader waiting, if any, wakes."""
        self._items.append(item)
        reader = self._reader
        if reader is not None and not reader.done():
            reader.set_result(None)

    async def get(self) -> T:
        """The oldest item, once there is one. Cancelling the wait loses nothing."""
        while not self._items:
            if self._reader is not None:
                msg = "a Mailbox has one reader at a time"
                raise RuntimeError(msg)
            self._reader = asyncio.get_running_loop().create_future()
            try:
                await self._reader
            finally:
                self._reader = None
        return self._items.pop(0)

    def qsize(self) -> int:
        """How many items wait."""
        return len(self._items)

    def empty(self) -> bool:
        """Whether no item waits."""
        return not self._items

    def clear(self) -> None:
        """Drop every waiting item."""
        self._items.clear()


class Flag:
    """`asyncio.Event`'s set/clear/wait, with the waiters' list made only when someone waits."""

    __slots__ = ("_set", "_waiters")

    def __init__(self, *, value: bool = False) -> None:
        self._set = value
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        """Whether the flag is set."""
        return self._set

    def set(self) -> None:
        """Set the flag; everyone waiting for it wakes."""
        if self._set:
            return
        self._set = True
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        """Unset the flag: the next `wait` waits."""
        self._set = False

    async def wait(self) -> bool:
        """Return True once the flag is set (at once when it is)."""
        if self._set:
            return True
        waiter = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if self._waiters is not None and waiter in self._waiters:
                self._waiters.remove(waiter)
        return True
