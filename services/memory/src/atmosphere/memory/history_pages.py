"""Reading a conversation's history, whole or in pages that each fit in one bus message.

A history can be larger than one bus message (20 messages of up to 256 KiB), so `history_page`
hands it out in pages of a given size, splitting a message that does not fit
(`PageMessage.partial`). The page token names where the next page starts and the history's
version (count and seq range): a history that changed between two pages is refused
(`StalePageTokenError`) rather than stitched from two different states.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from atmosphere.bus.sizes import head, utf8_len
from atmosphere.memory.store_connection import StoreConnection
from atmosphere.sdk import ChatMessage as Message


class StalePageTokenError(ValueError):
    """The history changed since the page token was issued (read it again from the start).

    Memory's handler answers it as the catalogue's `HistoryChangedError` (`memory.history_changed`);
    the store itself knows nothing of the bus.
    """


@dataclass(frozen=True, slots=True)
class PageMessage:
    """One message of a history page, or a part of one."""

    role: str
    content: str
    partial: bool = False
    """The content goes on in the next `PageMessage` (this page's or the next page's)."""


@dataclass(frozen=True, slots=True)
class HistoryPage:
    """Messages of one page and where the next page starts ("" after the last one)."""

    messages: list[PageMessage]
    next_token: str


@dataclass(frozen=True, slots=True)
class _Cursor:
    seq: int
    """The seq of the next message to send."""
    skip: int
    """Characters of that message already sent."""
    version: str

    def token(self) -> str:
        return f"{self.seq}:{self.skip}:{self.version}"

    @classmethod
    def parse(cls, token: str) -> _Cursor:
        parts = token.split(":")
        try:
            if len(parts) != 3 or len(token) > 200:
                raise ValueError
            seq, skip = int(parts[0]), int(parts[1])
        except ValueError:
            msg = "the history page token is malformed"
            raise ValueError(msg) from None
        if seq < 0 or skip < 0:
            msg = "the history page token is malformed"
            raise ValueError(msg)
        return cls(seq, skip, parts[2])


MIN_PAGE_PIECE: Final = 256
"""Bytes of room below which a page ends instead of starting another message part."""
_MESSAGE_OVERHEAD: Final = 16
"""Protobuf framing of one `ChatMessage` in a page (tags, lengths, the partial flag)."""


class HistoryPages(StoreConnection):
    """The reads of the `conversation_message` table: a history whole, or one page of it."""

    async def load_history(self, agent: str, conversation_id: str) -> list[Message]:
        """The stored history, oldest first (empty for an unknown conversation)."""
        async with self._lock:
            return await self._messages(agent, conversation_id)

    async def history_page(self, agent: str, conversation_id: str, token: str, *, max_bytes: int) -> HistoryPage:
        """One page of the history, of at most about `max_bytes` of message content.

        `token` is "" for the first page, else the previous page's `next_token`. A message that
        does not fit in the room left is split (its first part marked `partial`), so any history
        can be read whatever the page size.

        Raises:
            ValueError: a malformed token or a page size too small to make progress.
            StalePageTokenError: the history changed since `token` was issued.
        """
        if max_bytes < MIN_PAGE_PIECE:
            msg = f"a history page must hold at least {MIN_PAGE_PIECE} bytes, not {max_bytes}"
            raise ValueError(msg)
        async with self._lock:
            version, first_seq = await self._version(agent, conversation_id)
            cursor = _Cursor.parse(token) if token else _Cursor(first_seq, 0, version)
            if cursor.version != version:
                msg = "the conversation history changed while it was being read in pages; read it again"
                raise StalePageTokenError(msg)
            return await self._fill_page(agent, conversation_id, cursor, max_bytes)

    async def _version(self, agent: str, conversation_id: str) -> tuple[str, int]:
        """The history's version (count and seq range: any append, deletion or rewrite moves it) and first seq."""
        # `execute_fetchall`: one hop to aiosqlite's thread, not three (execute, fetch, close);
        # every run reads its history, so this is on every run's path.
        rows = await self._db.execute_fetchall(
            "SELECT COUNT(*), MIN(seq), MAX(seq) FROM conversation_message WHERE agent = ? AND conversation_id = ?",
            (agent, conversation_id),
        )
        count, low, high = next(iter(rows), (0, None, None))
        return f"{count}-{low or 0}-{high or 0}", int(low or 0)

    async def _fill_page(self, agent: str, conversation_id: str, cursor: _Cursor, max_bytes: int) -> HistoryPage:
        messages: list[PageMessage] = []
        room = max_bytes
        skip = cursor.skip
        # The rest of the history in one hop (it is bounded: `max_messages`, each message cut to size).
        rows = await self._db.execute_fetchall(
            "SELECT seq, role, content FROM conversation_message"
            " WHERE agent = ? AND conversation_id = ? AND seq >= ? ORDER BY seq",
            (agent, conversation_id, cursor.seq),
        )
        for seq, role, content in rows:
            rest = content[skip:] if skip else content
            cost = utf8_len(rest) + utf8_len(role) + _MESSAGE_OVERHEAD
            if cost <= room:
                messages.append(PageMessage(role, rest))
                room -= cost
                skip = 0
                continue
            piece_room = room - utf8_len(role) - _MESSAGE_OVERHEAD
            if piece_room < MIN_PAGE_PIECE and messages:
                return HistoryPage(messages, _Cursor(seq, skip, cursor.version).token())
            piece = head(rest, max(piece_room, MIN_PAGE_PIECE // 2))
            messages.append(PageMessage(role, piece, partial=True))
            return HistoryPage(messages, _Cursor(seq, skip + len(piece), cursor.version).token())
        return HistoryPage(messages, "")

    async def _messages(self, agent: str, conversation_id: str) -> list[Message]:
        # One call on the database's thread (execute, fetch and close would be three): a history
        # is read on every run's way to its first token.
        rows = await self._db.execute_fetchall(
            "SELECT role, content FROM conversation_message WHERE agent = ? AND conversation_id = ? ORDER BY seq",
            (agent, conversation_id),
        )
        return [Message(role, content) for role, content in rows]
