import ast
import asyncio
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from atmosphere.memory import store as store_module
from atmosphere.memory.store import (
    MAX_CONTENT_BYTES,
    MAX_FACT_CHARS,
    SCHEMA_VERSION,
    TRUNCATION_MARKER,
    MemoryStore,
)
from atmosphere.sdk import ChatMessage as Message
from atmosphere.sdk import compaction as compaction_module
from atmosphere.sdk.compaction import (
    apply_summary,
    estimate_tokens,
    split_for_summary,
    summary_of,
)

SYS = Message("system", "You are helpful.")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[MemoryStore]:
    async with MemoryStore.open(tmp_path / "memory.db") as opened:
        yield opened


def user(i: int, size: int = 0) -> Message:
    return Message("user", f"question {i}".ljust(size, "."))


def answer(i: int, size: int = 0) -> Message:
    return Message("assistant", f"answer {i}".ljust(size, "."))


async def append(store: MemoryStore, i: int, **options: Any) -> int:
    options.setdefault("strategy", "sliding-window")
    options.setdefault("max_messages", 20)
    return await store.append_turn("agent", "c1", user(i), answer(i), **options)


async def append_sized(store: MemoryStore, i: int, size: int, **options: Any) -> int:
    return await store.append_turn("agent", "c1", user(i, size), answer(i, size), max_messages=20, **options)


# --- history --------------------------------------------------------------------------------


async def test_round_trip(store: MemoryStore) -> None:
    assert await store.load_history("agent", "c1") == []
    assert await append(store, 1) == 2
    assert await append(store, 2) == 4
    assert await store.load_history("agent", "c1") == [user(1), answer(1), user(2), answer(2)]
    # Conversations are keyed by (agent, conversation id).
    assert await store.load_history("other-agent", "c1") == []
    assert await store.load_history("agent", "c2") == []


async def test_error_turn_keeps_only_the_user_message(store: MemoryStore) -> None:
    count = await store.append_turn("agent", "c1", user(1), None, strategy="sliding-window", max_messages=20)
    assert count == 1
    assert await store.load_history("agent", "c1") == [user(1)]


async def test_replace_and_clear(store: MemoryStore) -> None:
    await append(store, 1)
    assert await store.replace_history("agent", "c1", [SYS, answer(9)]) is True
    assert await store.load_history("agent", "c1") == [SYS, answer(9)]
    assert await append(store, 2) == 4
    await store.clear_history("agent", "c1")
    assert await store.load_history("agent", "c1") == []


async def test_replace_with_base_keeps_a_turn_appended_meanwhile(store: MemoryStore) -> None:
    for i in range(3):
        await append(store, i)
    loaded = await store.load_history("agent", "c1")
    await append(store, 3)  # lands while the caller is summarizing
    assert await store.replace_history("agent", "c1", [SYS], base=loaded) is True
    assert await store.load_history("agent", "c1") == [SYS, user(3), answer(3)]
    # The same base again is stale: nothing is written.
    assert await store.replace_history("agent", "c1", [answer(0)], base=loaded) is False
    assert await store.load_history("agent", "c1") == [SYS, user(3), answer(3)]


async def test_blank_conversation_id_is_rejected(store: MemoryStore) -> None:
    with pytest.raises(ValueError, match="conversation id"):
        await store.append_turn("agent", " ", user(1), None, strategy="", max_messages=20)
    with pytest.raises(ValueError, match="at least 1"):
        await store.append_turn("agent", "c1", user(1), None, strategy="", max_messages=0)


async def test_content_is_bounded(store: MemoryStore) -> None:
    huge = "é" * MAX_CONTENT_BYTES  # two bytes each: twice the bound
    await store.append_turn("agent", "c1", Message("user", huge), None, strategy="", max_messages=20)
    [stored] = await store.load_history("agent", "c1")
    assert len(stored.content.encode()) <= MAX_CONTENT_BYTES
    assert stored.content.endswith(TRUNCATION_MARKER)
    assert set(stored.content.removesuffix(TRUNCATION_MARKER)) == {"é"}
    exact = "x" * MAX_CONTENT_BYTES
    await store.replace_history("agent", "c1", [Message("user", exact)])
    assert await store.load_history("agent", "c1") == [Message("user", exact)]


# --- 200-turn conversations -----------------------------------------------------------------


async def test_sliding_window_200_turns(store: MemoryStore) -> None:
    await store.replace_history("agent", "c1", [SYS])
    appended: list[Message] = []
    for i in range(200):
        count = await append(store, i)
        appended += [user(i), answer(i)]
        history = await store.load_history("agent", "c1")
        assert count == len(history) <= 20
        assert history == [SYS, *appended[-(len(history) - 1) :]]
    assert history == [SYS, *appended[-19:]]


async def test_token_window_200_turns(store: MemoryStore) -> None:
    await store.replace_history("agent", "c1", [SYS])
    appended: list[Message] = []
    for i in range(200):
        size = 200 + (i % 7) * 300  # 50 to 500 tokens a message: the 4,000-token window binds
        count = await append_sized(store, i, size, strategy="token-window", model="unknown-model")
        appended += [user(i, size), answer(i, size)]
        history = await store.load_history("agent", "c1")
        assert count == len(history) <= 20
        assert history[0] == SYS
        assert history[1:] == appended[-(len(history) - 1) :]
        assert sum(estimate_tokens(m) for m in history) <= 4_000
        assert history[-1] == answer(i, size)
    assert len(history) < 20  # tokens, not the message count, bound this conversation


async def test_token_window_big_model_is_bounded_by_message_count(store: MemoryStore) -> None:
    for i in range(30):
        count = await append(store, i, strategy="token-window", model="gpt-4o-mini-2024-07-18")
    assert count == 20
    assert (await store.load_history("agent", "c1"))[-1] == answer(29)


async def test_token_window_with_long_messages(store: MemoryStore) -> None:
    # 6,000 chars = 1,500 tokens: two messages fill an unknown model's window.
    assert await append_sized(store, 1, 6_000, strategy="token-window") == 2
    assert await append_sized(store, 2, 6_000, strategy="token-window") == 2
    assert await store.load_history("agent", "c1") == [user(2, 6_000), answer(2, 6_000)]
    # A message bigger than the whole window cannot be kept.
    assert await append_sized(store, 3, 20_000, strategy="token-window") == 0


async def summarize_like_the_caller(store: MemoryStore, turn: int) -> None:
    history = await store.load_history("agent", "c1")
    plan = split_for_summary(history, 20)
    if plan is not None:
        assert await store.replace_history("agent", "c1", apply_summary(plan, f"summary {turn}"), base=history)


def check_summarized(history: list[Message], appended: list[Message]) -> None:
    assert history[0] == SYS
    summaries = [m for m in history if summary_of(m)]
    assert len(summaries) <= 1
    verbatim = [m for m in history if m.role != "system"]
    assert verbatim == appended[-len(verbatim) :]
    replaced = summary_of(summaries[0]) if summaries else (0, "")
    assert replaced is not None
    assert replaced[0] + len(verbatim) == len(appended)


async def test_summarizing_200_turns(store: MemoryStore) -> None:
    await store.replace_history("agent", "c1", [SYS])
    appended: list[Message] = []
    for i in range(200):
        count = await append(store, i, strategy="summarizing")
        appended += [user(i), answer(i)]
        assert count <= 22  # over the bound by at most one turn until the caller summarizes
        await summarize_like_the_caller(store, i)
        history = await store.load_history("agent", "c1")
        assert len(history) <= 20
        check_summarized(history, appended)
    assert any(summary_of(m) for m in history)


async def test_summarizing_backstop_when_the_caller_never_summarizes(store: MemoryStore) -> None:
    await store.replace_history("agent", "c1", [SYS])
    appended: list[Message] = []
    for i in range(100):
        count = await append(store, i, strategy="summarizing")
        appended += [user(i), answer(i)]
        assert count < 40
        history = await store.load_history("agent", "c1")
        assert len(history) == count
        check_summarized(history, appended)
    assert any(summary_of(m) for m in history)


async def test_summarizing_without_room_for_a_summary_slides(store: MemoryStore) -> None:
    await store.replace_history("agent", "c1", [Message("system", "one"), Message("system", "two")])
    assert await append(store, 1, strategy="summarizing", max_messages=3) == 3
    assert await store.load_history("agent", "c1") == [Message("system", "one"), Message("system", "two"), answer(1)]


# --- concurrency and atomicity --------------------------------------------------------------


async def test_concurrent_appends_all_land(store: MemoryStore) -> None:
    async with asyncio.TaskGroup() as group:
        for i in range(50):
            group.create_task(append(store, i, max_messages=1_000))
    history = await store.load_history("agent", "c1")
    assert len(history) == 100
    pairs = list(zip(history[::2], history[1::2], strict=True))
    assert sorted(pairs, key=lambda p: int(p[0].content.split()[1])) == [(user(i), answer(i)) for i in range(50)]


async def test_two_connections_to_one_file(tmp_path: Path) -> None:
    async with MemoryStore.open(tmp_path / "m.db") as first, MemoryStore.open(tmp_path / "m.db") as second:
        async with asyncio.TaskGroup() as group:
            for i in range(20):
                group.create_task(append(first, i, max_messages=1_000))
                group.create_task(append(second, 100 + i, max_messages=1_000))
        history = await first.load_history("agent", "c1")
    assert len(history) == 80
    assert all(
        u.role == "user" and a == Message("assistant", u.content.replace("question", "answer"))
        for u, a in zip(history[::2], history[1::2], strict=True)
    )


def hang_after_the_turns_insert(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch, blocker: Callable[[], Awaitable[Any]]
) -> None:
    """The turn's messages are inserted (not committed), then `blocker` runs in place of the rest."""
    db = store._db
    original = db.executemany

    async def executemany(sql: str, parameters: Any) -> Any:
        cursor = await original(sql, parameters)
        if sql.startswith("INSERT INTO conversation_message"):
            await blocker()
        return cursor

    monkeypatch.setattr(db, "executemany", executemany)


async def test_cancelled_append_leaves_no_partial_turn(store: MemoryStore, monkeypatch: pytest.MonkeyPatch) -> None:
    await append(store, 1)
    reached = asyncio.Event()

    async def hang() -> None:
        reached.set()
        await asyncio.Event().wait()

    hang_after_the_turns_insert(store, monkeypatch, hang)
    task = asyncio.create_task(append(store, 2))
    await reached.wait()  # turn 2's messages are inserted, not committed
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    monkeypatch.undo()
    assert await store.load_history("agent", "c1") == [user(1), answer(1)]
    assert await append(store, 3) == 4  # the connection is usable: no transaction left open


async def test_failed_append_rolls_back(store: MemoryStore, monkeypatch: pytest.MonkeyPatch) -> None:
    async def fail() -> None:
        raise sqlite3.OperationalError("disk I/O error")

    hang_after_the_turns_insert(store, monkeypatch, fail)
    with pytest.raises(sqlite3.OperationalError):
        await append(store, 1)
    monkeypatch.undo()
    assert await store.load_history("agent", "c1") == []
    assert await append(store, 2) == 2


# --- lifecycle ------------------------------------------------------------------------------


async def test_persistence_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "data" / "memory.db"
    store = await MemoryStore.open(path)
    await store.append_turn("agent", "c1", user(1), answer(1), strategy="", max_messages=20)
    await store.save_facts("alice", ["likes tea"])
    await store.close()
    await store.close()  # idempotent
    async with MemoryStore.open(path) as reopened:
        assert await reopened.load_history("agent", "c1") == [user(1), answer(1)]
        assert await reopened.get_facts("alice") == ["likes tea"]
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert raw.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    raw.close()


async def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    async with MemoryStore.open(path):
        pass
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    raw.close()
    with pytest.raises(RuntimeError, match="newer"):
        await MemoryStore.open(path)


# --- long-term facts ------------------------------------------------------------------------


async def test_facts_fifo_at_100(store: MemoryStore) -> None:
    facts = [f"fact {i}" for i in range(130)]
    assert await store.save_facts("alice", facts[:60]) == 60
    for fact in facts[60:]:
        assert await store.save_facts("alice", [fact]) == 1
    assert await store.fact_count("alice") == 100
    assert await store.get_facts("alice", max=1_000) == facts[30:]


async def test_facts_dedupe_and_refresh(store: MemoryStore) -> None:
    assert await store.save_facts("alice", ["likes tea", "likes tea", "  likes   tea ", "", "   "]) == 1
    assert await store.save_facts("alice", ["lives in Paris"]) == 1
    assert await store.save_facts("alice", ["likes tea"]) == 0
    assert await store.fact_count("alice") == 2
    # Saving a known fact again makes it the newest.
    assert await store.get_facts("alice") == ["lives in Paris", "likes tea"]


async def test_recall_newest_twenty_oldest_first(store: MemoryStore) -> None:
    facts = [f"fact {i}" for i in range(30)]
    await store.save_facts("alice", facts)
    assert await store.get_facts("alice") == facts[10:]
    assert await store.get_facts("alice", max=3) == facts[27:]
    assert await store.get_facts("alice", max=0) == []
    assert await store.get_facts("bob") == []


async def test_replace_and_clear_facts(store: MemoryStore) -> None:
    await store.save_facts("alice", ["a", "b"])
    await store.save_facts("bob", ["x"])
    assert await store.replace_facts("alice", ["c", "c", "d"]) == 2
    assert await store.get_facts("alice") == ["c", "d"]
    assert await store.replace_facts("alice", [f"f{i}" for i in range(150)]) == 100
    assert (await store.get_facts("alice", max=1))[0] == "f149"
    await store.clear_facts("alice")
    assert await store.fact_count("alice") == 0
    assert await store.get_facts("bob") == ["x"]


async def test_fact_text_is_bounded(store: MemoryStore) -> None:
    await store.save_facts("alice", ["y" * 5_000])
    [fact] = await store.get_facts("alice")
    assert len(fact) == MAX_FACT_CHARS
    assert fact.endswith("…")


@pytest.mark.parametrize("call", ["save", "get", "count", "clear", "replace"])
async def test_blank_user_ids_are_rejected(store: MemoryStore, call: str) -> None:
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "save": lambda: store.save_facts("  ", ["x"]),
        "get": lambda: store.get_facts(""),
        "count": lambda: store.fact_count(""),
        "clear": lambda: store.clear_facts(" "),
        "replace": lambda: store.replace_facts("", ["x"]),
    }
    with pytest.raises(ValueError, match="blank user id"):
        await calls[call]()


@pytest.mark.parametrize("module", [store_module, compaction_module])
def test_no_bus_imports(module: ModuleType) -> None:
    # Storage and compaction are plain logic: the bus stays in the service's wiring. The bus's
    # pure size helpers (how many bytes a page may hold, cutting text between characters) send
    # nothing, and are the one definition every service shares.
    tree = ast.parse(Path(str(module.__file__)).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported -= {"atmosphere.bus.sizes"}
    assert not any(name.startswith(("nats", "atmosphere.bus")) for name in imported)
