"""The memory service's SQLite store: conversation history and long-term facts, in one file.

Opened as the tape and governance stores are (`atmosphere.service.sqlite.open_sqlite`: WAL with
synchronous=NORMAL, a committed write survives a crash of this process), one aiosqlite
connection whose users take turns.
Every write is ONE `BEGIN IMMEDIATE … COMMIT` transaction, rolled back on any exception or
cancellation, so a crash never leaves half a turn or a half-applied compaction. Reads take
the same turn: on a shared connection a reader could otherwise see another coroutine's
uncommitted half-written turn. `BEGIN IMMEDIATE` also makes a second process writing the same
file wait for the lock (busy timeout) instead of failing on a read-to-write upgrade.

Compaction on append: `sliding-window` and `token-window` run inside the append's transaction.
`summarizing` needs a model, which the store does not call, so the caller does it: when
`append_turn` returns more than `max_messages`, load the history, `split_for_summary`, get the
summary (model, or `local_summary`), `apply_summary` and `replace_history(..., base=loaded)`.
`base` makes that replacement safe against a turn appended meanwhile (it is kept, after the
summary). As a backstop, a history the caller never summarizes is summarized locally inside
the append once it reaches twice `max_messages`.

Reading in pages: a history can be larger than one bus message (20 messages of up to 256 KiB),
so `history_page` hands it out in pages of a given size, splitting a message that does not fit
(`PageMessage.partial`). The page token names where the next page starts and the history's
version (count and seq range): a history that changed between two pages is refused
(`StalePageTokenError`) rather than stitched from two different states.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import aiosqlite

from atmosphere.bus.sizes import head, utf8_len
from atmosphere.sdk import ChatMessage as Message
from atmosphere.sdk.compaction import (
    DEFAULT_RECENT_WINDOW,
    SLIDING_WINDOW,
    TOKEN_WINDOW,
    apply_summary,
    history_digest,
    model_window,
    parse_strategy,
    sliding_window_keep,
    split_for_summary,
    token_window_keep,
)
from atmosphere.service.sqlite import open_sqlite

_log = logging.getLogger(__name__)

SCHEMA_VERSION: Final = 1
MAX_CONTENT_BYTES: Final = 256 * 1024
"""A stored message's content is cut to this many UTF-8 bytes (marker included)."""
TRUNCATION_MARKER: Final = "\n…[truncated]"
MAX_FACT_CHARS: Final = 1_000
"""A stored fact is cut to this many characters (marker included)."""
MAX_FACTS_PER_USER: Final = 100
"""Beyond this, the oldest facts of the user are evicted (FIFO)."""
DEFAULT_FACTS_RECALLED: Final = 20
SUMMARY_BACKSTOP_FACTOR: Final = 2
"""`summarizing`: the append itself summarizes (locally) at this multiple of `max_messages`."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS conversation_message (
    agent TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    PRIMARY KEY (agent, conversation_id, seq)
);
CREATE TABLE IF NOT EXISTS applied_append (
    -- The `ATMO_MEMORY` sequence of the last turn appended (one row): a turn re-delivered after
    -- a crash between its commit and its acknowledgement is recognised and not appended twice.
    id INTEGER PRIMARY KEY CHECK (id = 1),
    seq INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS user_fact (
    user_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    fact TEXT NOT NULL,
    PRIMARY KEY (user_id, seq),
    UNIQUE (user_id, fact)
);
"""


def bound_content(text: str) -> str:
    """`text` cut to `MAX_CONTENT_BYTES` UTF-8 bytes, ending with `TRUNCATION_MARKER` when cut."""
    try:
        data = text.encode()
    except UnicodeEncodeError:  # lone surrogates: SQLite stores UTF-8 only
        data = text.encode(errors="replace")
        text = data.decode()
    if len(data) <= MAX_CONTENT_BYTES:
        return text
    budget = MAX_CONTENT_BYTES - len(TRUNCATION_MARKER.encode())
    return data[:budget].decode(errors="ignore") + TRUNCATION_MARKER


def bound_fact(fact: str) -> str:
    """`fact` as it is stored: whitespace collapsed, at most `MAX_FACT_CHARS` characters."""
    return _bound_fact(fact)


def _bound_fact(fact: str) -> str:
    fact = " ".join(fact.split())
    if len(fact) <= MAX_FACT_CHARS:
        return fact
    return fact[: MAX_FACT_CHARS - 1] + "…"


def _clean_facts(facts: Sequence[str]) -> list[str]:
    """Bounded, non-blank, each once (first occurrence's place)."""
    return list(dict.fromkeys(f for f in (_bound_fact(fact) for fact in facts) if f))


def _check_user(user_id: str) -> None:
    if not user_id.strip():
        msg = "a blank user id has no long-term memory"
        raise ValueError(msg)


def _check_conversation(conversation_id: str) -> None:
    if not conversation_id.strip():
        msg = "a blank conversation id has no history"
        raise ValueError(msg)


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


async def _create_schema(db: aiosqlite.Connection, path: Path) -> None:
    """Create the tables (if missing) and check the file's schema version is one this service reads."""
    await db.executescript(_SCHEMA)
    await db.execute("BEGIN IMMEDIATE")
    async with db.execute("SELECT MAX(version) FROM schema_version") as cursor:
        row = await cursor.fetchone()
    version = None if row is None else row[0]
    if version is None:
        await db.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
    elif version > SCHEMA_VERSION:
        msg = f"{path}: schema version {version} is newer than this service's {SCHEMA_VERSION}"
        raise RuntimeError(msg)
    await db.commit()


class _Opening:
    """What `MemoryStore.open` returns: await it, or use it as an async context manager."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._store: MemoryStore | None = None

    def __await__(self) -> Generator[Any, None, MemoryStore]:
        return MemoryStore.connect(self._path).__await__()

    async def __aenter__(self) -> MemoryStore:
        self._store = await MemoryStore.connect(self._path)
        return self._store

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._store is not None:
            await self._store.close()


class MemoryStore:
    """Conversation history per (agent, conversation id) and long-term facts per user id."""

    def __init__(self, db: aiosqlite.Connection, *, closing: contextlib.AsyncExitStack | None = None) -> None:
        """Use an open connection (see `open`); `closing` closes it (None: `close` closes `db` itself)."""
        self._db = db
        self._lock = asyncio.Lock()
        self._closed = False
        self._closing = closing

    # ----------------------------------------------------------------------------------------
    # Lifecycle
    # ----------------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: Path | str) -> _Opening:
        """Open (creating if needed) the store at `path`.

        `store = await MemoryStore.open(path)` … `await store.close()`, or
        `async with MemoryStore.open(path) as store:`.
        """
        return _Opening(Path(path))

    @classmethod
    async def connect(cls, path: Path) -> MemoryStore:
        """Open the database (WAL, `open_sqlite`) and create or check the schema."""
        # The store outlives this call (`open` may be awaited, not entered): the connection's
        # context stays open on a stack that `close` unwinds.
        closing = contextlib.AsyncExitStack()
        try:
            db = await closing.enter_async_context(open_sqlite(path))
            await _create_schema(db, path)
        except BaseException:
            await closing.aclose()
            raise
        return cls(db, closing=closing)

    async def close(self) -> None:
        """Wait for the operation in progress, then close the database (idempotent)."""
        async with self._lock:
            if not self._closed:
                self._closed = True
                if self._closing is None:
                    await self._db.close()
                else:
                    await self._closing.aclose()

    async def __aenter__(self) -> MemoryStore:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """One write transaction: committed if the body returns, rolled back otherwise."""
        async with self._lock:
            try:
                # Inside the try: a cancellation while BEGIN is queued must still roll back.
                await self._db.execute("BEGIN IMMEDIATE")
                yield self._db
            except BaseException:
                await self._db.rollback()
                raise
            await self._db.commit()

    # ----------------------------------------------------------------------------------------
    # Conversation history
    # ----------------------------------------------------------------------------------------

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
        async with self._db.execute(
            "SELECT role, content FROM conversation_message WHERE agent = ? AND conversation_id = ? ORDER BY seq",
            (agent, conversation_id),
        ) as cursor:
            rows = await cursor.fetchall()
        return [Message(role, content) for role, content in rows]

    async def append_turn(
        self,
        agent: str,
        conversation_id: str,
        user: Message,
        assistant: Message | None,
        *,
        strategy: str,
        max_messages: int,
        model: str | None = None,
        recent_window: int = DEFAULT_RECENT_WINDOW,
        log_seq: int = 0,
    ) -> int:
        """Append a turn and compact, in one transaction; the number of messages now stored.

        `log_seq` is the turn's sequence in the write log (`ATMO_MEMORY`), committed with it:
        a turn at or below the last one committed was appended already and is not appended again.

        `assistant` is None when the run ended in an error: only the user message is kept.
        `sliding-window` and `token-window` (with `model`'s window) compact here; for
        `summarizing` a result above `max_messages` tells the caller to summarize (module doc).
        """
        _check_conversation(conversation_id)
        if max_messages < 1:
            msg = f"max_messages must be at least 1, got {max_messages}"
            raise ValueError(msg)
        parsed = parse_strategy(strategy)
        turn = [user] if assistant is None else [user, assistant]
        async with self._transaction() as db:
            if log_seq and not await self._claim_append(db, log_seq):
                return await self._count(db, agent, conversation_id)
            async with db.execute(
                "SELECT seq, role, length(content) FROM conversation_message"
                " WHERE agent = ? AND conversation_id = ? ORDER BY seq",
                (agent, conversation_id),
            ) as cursor:
                rows: list[tuple[int, str, int]] = [(r[0], r[1], r[2]) for r in await cursor.fetchall()]
            next_seq = rows[-1][0] + 1 if rows else 1
            for offset, message in enumerate(turn):
                content = bound_content(message.content)
                await db.execute(
                    "INSERT INTO conversation_message (agent, conversation_id, seq, role, content)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (agent, conversation_id, next_seq + offset, message.role, content),
                )
                rows.append((next_seq + offset, message.role, len(content)))
            roles = [role for _, role, _ in rows]
            if parsed == TOKEN_WINDOW:
                keep = token_window_keep(roles, [chars for _, _, chars in rows], max_messages, model_window(model))
            elif parsed == SLIDING_WINDOW:
                keep = sliding_window_keep(roles, max_messages)
            else:
                return await self._summarizing_backstop(db, agent, conversation_id, max_messages, recent_window)
            kept = set(keep)
            await db.executemany(
                "DELETE FROM conversation_message WHERE agent = ? AND conversation_id = ? AND seq = ?",
                [(agent, conversation_id, seq) for index, (seq, _, _) in enumerate(rows) if index not in kept],
            )
            return len(keep)

    async def _summarizing_backstop(
        self, db: aiosqlite.Connection, agent: str, conversation_id: str, max_messages: int, recent_window: int
    ) -> int:
        """Inside an append: leave the summary to the caller unless the history got out of hand."""
        messages = await self._messages(agent, conversation_id)
        if len(messages) <= max_messages:
            return len(messages)
        plan = split_for_summary(messages, max_messages, recent_window)
        if plan is None:  # no room for a summary next to the system messages
            keep = sliding_window_keep([m.role for m in messages], max_messages)
            compacted = [messages[i] for i in keep]
        elif len(messages) >= SUMMARY_BACKSTOP_FACTOR * max_messages:
            _log.warning(
                "conversation %s/%s was not summarized by its caller; summarizing %d messages locally",
                agent,
                conversation_id,
                len(plan.old),
            )
            compacted = apply_summary(plan, None)
        else:
            return len(messages)
        await self._rewrite(db, agent, conversation_id, compacted)
        return len(compacted)

    async def _rewrite(
        self, db: aiosqlite.Connection, agent: str, conversation_id: str, messages: Sequence[Message]
    ) -> None:
        await db.execute(
            "DELETE FROM conversation_message WHERE agent = ? AND conversation_id = ?", (agent, conversation_id)
        )
        await db.executemany(
            "INSERT INTO conversation_message (agent, conversation_id, seq, role, content) VALUES (?, ?, ?, ?, ?)",
            [(agent, conversation_id, seq, m.role, bound_content(m.content)) for seq, m in enumerate(messages, 1)],
        )

    async def replace_history(
        self,
        agent: str,
        conversation_id: str,
        messages: Sequence[Message],
        *,
        base: Sequence[Message] | None = None,
        base_digest: tuple[int, str] | None = None,
    ) -> bool:
        """Replace the stored history with `messages` (after a summarizing compaction).

        Stored as given (contents bounded, not compacted).
        With `base` (the history the replacement was computed from), only replace if the stored
        history still begins with `base`; messages appended after it are kept after `messages`.
        `base_digest` (count, `history_digest` of those messages) is the same guard for a base
        too large to send. False, and nothing written, when the stored history no longer begins
        with the base (another compaction or a clear got there first).
        """
        _check_conversation(conversation_id)
        async with self._transaction() as db:
            replacement = list(messages)
            if base is not None:
                current = await self._messages(agent, conversation_id)
                bounded_base = [Message(m.role, bound_content(m.content)) for m in base]
                if current[: len(bounded_base)] != bounded_base:
                    return False
                replacement += current[len(bounded_base) :]
            elif base_digest is not None:
                count, digest = base_digest
                current = await self._messages(agent, conversation_id)
                if count < 0 or len(current) < count or history_digest(current[:count]) != digest:
                    return False
                replacement += current[count:]
            await self._rewrite(db, agent, conversation_id, replacement)
            return True

    async def clear_history(self, agent: str, conversation_id: str) -> None:
        """Forget the conversation."""
        async with self._transaction() as db:
            await db.execute(
                "DELETE FROM conversation_message WHERE agent = ? AND conversation_id = ?", (agent, conversation_id)
            )

    # ----------------------------------------------------------------------------------------
    # Long-term facts
    # ----------------------------------------------------------------------------------------

    async def save_facts(self, user_id: str, facts: Sequence[str]) -> int:
        """Remember `facts` about `user_id`; the number that were not already known.

        Facts are whitespace-normalized and bounded to `MAX_FACT_CHARS`; blank ones are skipped.
        Saving a known fact again refreshes it (it becomes the newest) instead of duplicating it.
        Beyond `MAX_FACTS_PER_USER`, the oldest facts are evicted.
        """
        _check_user(user_id)
        cleaned = _clean_facts(facts)
        if not cleaned:
            return 0
        async with self._transaction() as db:
            async with db.execute("SELECT fact, seq FROM user_fact WHERE user_id = ?", (user_id,)) as cursor:
                known = {str(fact): int(seq) for fact, seq in await cursor.fetchall()}
            next_seq = max(known.values(), default=0) + 1
            await db.executemany(
                "INSERT INTO user_fact (user_id, seq, fact) VALUES (?, ?, ?)"
                " ON CONFLICT (user_id, fact) DO UPDATE SET seq = excluded.seq",
                [(user_id, next_seq + i, fact) for i, fact in enumerate(cleaned)],
            )
            await self._evict(db, user_id)
        return sum(1 for fact in cleaned if fact not in known)

    @staticmethod
    async def _claim_append(db: aiosqlite.Connection, log_seq: int) -> bool:
        """Record `log_seq` as the last appended turn; False when it (or a later one) already was."""
        async with db.execute("SELECT seq FROM applied_append WHERE id = 1") as cursor:
            row = await cursor.fetchone()
        if row is not None and int(row[0]) >= log_seq:
            return False
        await db.execute(
            "INSERT INTO applied_append (id, seq) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET seq = excluded.seq",
            (log_seq,),
        )
        return True

    @staticmethod
    async def _count(db: aiosqlite.Connection, agent: str, conversation_id: str) -> int:
        async with db.execute(
            "SELECT COUNT(*) FROM conversation_message WHERE agent = ? AND conversation_id = ?",
            (agent, conversation_id),
        ) as cursor:
            row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def _evict(self, db: aiosqlite.Connection, user_id: str) -> None:
        await db.execute(
            "DELETE FROM user_fact WHERE user_id = ? AND seq NOT IN"
            " (SELECT seq FROM user_fact WHERE user_id = ? ORDER BY seq DESC LIMIT ?)",
            (user_id, user_id, MAX_FACTS_PER_USER),
        )

    async def get_facts(self, user_id: str, max: int = DEFAULT_FACTS_RECALLED) -> list[str]:
        """The newest `max` facts about `user_id`, returned OLDEST FIRST so a prompt reads in order."""
        _check_user(user_id)
        if max <= 0:
            return []
        async with (
            self._lock,
            self._db.execute(
                "SELECT fact FROM (SELECT seq, fact FROM user_fact WHERE user_id = ? ORDER BY seq DESC LIMIT ?)"
                " ORDER BY seq",
                (user_id, max),
            ) as cursor,
        ):
            rows = await cursor.fetchall()
        return [fact for (fact,) in rows]

    async def fact_count(self, user_id: str) -> int:
        """How many facts are stored about `user_id`."""
        _check_user(user_id)
        async with (
            self._lock,
            self._db.execute("SELECT COUNT(*) FROM user_fact WHERE user_id = ?", (user_id,)) as cursor,
        ):
            row = await cursor.fetchone()
        return 0 if row is None else int(row[0])

    async def clear_facts(self, user_id: str) -> None:
        """Forget everything about `user_id`."""
        _check_user(user_id)
        async with self._transaction() as db:
            await db.execute("DELETE FROM user_fact WHERE user_id = ?", (user_id,))

    async def replace_facts(self, user_id: str, facts: Sequence[str]) -> int:
        """Replace all facts about `user_id` with `facts` in one transaction; how many are stored.

        Facts are cleaned as in `save_facts`; of more than `MAX_FACTS_PER_USER`, the last ones are kept.
        """
        _check_user(user_id)
        cleaned = _clean_facts(facts)[-MAX_FACTS_PER_USER:]
        async with self._transaction() as db:
            await db.execute("DELETE FROM user_fact WHERE user_id = ?", (user_id,))
            await db.executemany(
                "INSERT INTO user_fact (user_id, seq, fact) VALUES (?, ?, ?)",
                [(user_id, seq, fact) for seq, fact in enumerate(cleaned, 1)],
            )
        return len(cleaned)
