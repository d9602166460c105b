"""Writing a conversation's history: appending turns (with compaction) and replacing or clearing it.

Compaction on append: `sliding-window` and `token-window` run inside the append's transaction.
`summarizing` needs a model, which the store does not call, so the caller does it: when
`append_turn` returns more than `max_messages`, load the history, `split_for_summary`, get the
summary (model, or `local_summary`), `apply_summary` and `replace_history(..., base=loaded)`.
`base` makes that replacement safe against a turn appended meanwhile (it is kept, after the
summary). As a backstop, a history the caller never summarizes is summarized locally inside
the append once it reaches twice `max_messages`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Final

import aiosqlite

from atmosphere.memory.history_pages import HistoryPages
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

_log = logging.getLogger("atmosphere.memory.store")

MAX_CONTENT_BYTES: Final = 256 * 1024
"""A stored message's content is cut to this many UTF-8 bytes (marker included)."""
TRUNCATION_MARKER: Final = "\n…[truncated]"
SUMMARY_BACKSTOP_FACTOR: Final = 2
"""`summarizing`: the append itself summarizes (locally) at this multiple of `max_messages`."""


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


def _check_conversation(conversation_id: str) -> None:
    if not conversation_id.strip():
        msg = "a blank conversation id has no history"
        raise ValueError(msg)


class ConversationHistory(HistoryPages):
    """Conversation history per (agent, conversation id): its reads (`HistoryPages`) and its writes."""

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
            rows = await self._add_turn(db, agent, conversation_id, turn)
            roles = [role for _, role, _ in rows]
            if parsed == TOKEN_WINDOW:
                keep = token_window_keep(roles, [chars for _, _, chars in rows], max_messages, model_window(model))
            elif parsed == SLIDING_WINDOW:
                keep = sliding_window_keep(roles, max_messages)
            else:
                return await self._summarizing_backstop(db, agent, conversation_id, max_messages, recent_window)
            kept = set(keep)
            dropped = [(agent, conversation_id, seq) for index, (seq, _, _) in enumerate(rows) if index not in kept]
            if dropped:  # a short conversation keeps all: no call on the database's thread
                await db.executemany(
                    "DELETE FROM conversation_message WHERE agent = ? AND conversation_id = ? AND seq = ?", dropped
                )
            return len(keep)

    @staticmethod
    async def _add_turn(
        db: aiosqlite.Connection, agent: str, conversation_id: str, turn: list[Message]
    ) -> list[tuple[int, str, int]]:
        """Insert `turn` after the stored messages; every message now stored as (seq, role, length)."""
        # `execute_fetchall`: one call on the database's thread where execute, fetch and close are three.
        found = await db.execute_fetchall(
            "SELECT seq, role, length(content) FROM conversation_message"
            " WHERE agent = ? AND conversation_id = ? ORDER BY seq",
            (agent, conversation_id),
        )
        rows: list[tuple[int, str, int]] = [(r[0], r[1], r[2]) for r in found]
        next_seq = rows[-1][0] + 1 if rows else 1
        added = [
            (agent, conversation_id, next_seq + offset, message.role, bound_content(message.content))
            for offset, message in enumerate(turn)
        ]
        # One call on the database's thread for the turn's messages (each call is a hop there and back).
        await db.executemany(
            "INSERT INTO conversation_message (agent, conversation_id, seq, role, content) VALUES (?, ?, ?, ?, ?)",
            added,
        )
        rows.extend((seq, role, len(content)) for _, _, seq, role, content in added)
        return rows

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

    @staticmethod
    async def _claim_append(db: aiosqlite.Connection, log_seq: int) -> bool:
        """Record `log_seq` as the last appended turn; False when it (or a later one) already was."""
        # One statement (one hop to the database's thread): the update is skipped, and no row
        # changes, when the recorded turn is this one or a later one.
        cursor = await db.execute(
            "INSERT INTO applied_append (id, seq) VALUES (1, ?) ON CONFLICT (id)"
            " DO UPDATE SET seq = excluded.seq WHERE excluded.seq > applied_append.seq",
            (log_seq,),
        )
        return cursor.rowcount == 1

    @staticmethod
    async def _count(db: aiosqlite.Connection, agent: str, conversation_id: str) -> int:
        async with db.execute(
            "SELECT COUNT(*) FROM conversation_message WHERE agent = ? AND conversation_id = ?",
            (agent, conversation_id),
        ) as cursor:
            row = await cursor.fetchone()
        return int(row[0]) if row else 0
