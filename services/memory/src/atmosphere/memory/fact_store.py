"""Long-term facts per user id: bounded, each once, the oldest evicted beyond `MAX_FACTS_PER_USER`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import aiosqlite

from atmosphere.memory.store_connection import StoreConnection

MAX_FACT_CHARS: Final = 1_000
"""A stored fact is cut to this many characters (marker included)."""
MAX_FACTS_PER_USER: Final = 100
"""Beyond this, the oldest facts of the user are evicted (FIFO)."""
DEFAULT_FACTS_RECALLED: Final = 20


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


class LongTermFacts(StoreConnection):
    """The `user_fact` table: what is remembered about each user."""

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
