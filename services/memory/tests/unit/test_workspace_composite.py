"""Composite routing, the per-owner provider (LRU, conversation cap, drop), routes and owner names."""

from __future__ import annotations

import gc
import logging
import os
from pathlib import Path

import pytest

from atmosphere.memory.vfs.composite import CompositeFileSystem, parse_routes
from atmosphere.memory.vfs.conversation_stores import ConversationStores
from atmosphere.memory.vfs.file_tools import run_file_tool
from atmosphere.memory.vfs.filestore import Limits, WorkspaceFileSystem
from atmosphere.memory.vfs.filesystem import Entry, Hit, WorkspaceError
from atmosphere.memory.vfs.paths import sanitize_owner

# ---- composite


@pytest.fixture
def stores(tmp_path: Path) -> tuple[WorkspaceFileSystem, WorkspaceFileSystem, WorkspaceFileSystem]:
    return (
        WorkspaceFileSystem(tmp_path / "default"),
        WorkspaceFileSystem(tmp_path / "memory"),
        WorkspaceFileSystem(tmp_path / "deep"),
    )


@pytest.fixture
def composite(stores: tuple[WorkspaceFileSystem, ...]) -> CompositeFileSystem:
    default, memory, deep = stores
    return CompositeFileSystem(default, {"memory/": memory, "memory/deep": deep})


def test_routing_is_segment_aware_longest_prefix(
    composite: CompositeFileSystem, stores: tuple[WorkspaceFileSystem, ...], tmp_path: Path
) -> None:
    default, memory, deep = stores
    composite.write("memory/a.md", "m")
    composite.write("memory/deep/b.md", "d")
    composite.write("memoryx/c.md", "x")  # shares the characters, not the segment
    composite.write("notes.md", "n")
    assert (tmp_path / "memory" / "memory" / "a.md").read_text() == "m"  # path passed unchanged
    assert (tmp_path / "deep" / "memory" / "deep" / "b.md").read_text() == "d"
    assert (tmp_path / "default" / "memoryx" / "c.md").read_text() == "x"
    assert composite.route("memory") is memory
    assert composite.route("memory/deep") is deep
    assert composite.route("memory/deeper") is memory
    assert composite.read("memory/deep/b.md") == "d"
    assert default.usage() == (2, 2)
    assert composite.usage() == (4, 4)


def test_root_ls_merges_and_scoped_ls_routes(composite: CompositeFileSystem) -> None:
    composite.write("memory/a.md", "m")
    composite.write("memory/deep/b.md", "dd")
    composite.write("z.txt", "z")
    composite.write("b/x", "x")
    assert composite.ls() == [Entry("b", 0, True), Entry("memory", 0, True), Entry("z.txt", 1, False)]
    assert composite.ls(".") == composite.ls()
    assert composite.ls("memory") == [Entry("memory/a.md", 1, False)]  # the memory backend only
    assert composite.ls("memory/deep") == [Entry("memory/deep/b.md", 2, False)]


def test_glob_and_grep_fan_out(composite: CompositeFileSystem, stores: tuple[WorkspaceFileSystem, ...]) -> None:
    default, _, _ = stores
    composite.write("memory/a.md", "hit m")
    composite.write("memory/deep/b.md", "hit d")
    composite.write("n.md", "hit n")
    default.write("memory/stale.md", "hit stale")  # unreachable through the composite: hidden
    assert composite.glob("**/*.md") == ["memory/a.md", "memory/deep/b.md", "n.md"]
    assert composite.grep("hit") == [
        Hit("n.md", 1, "hit n"),
        Hit("memory/a.md", 1, "hit m"),
        Hit("memory/deep/b.md", 1, "hit d"),
    ]
    assert composite.grep("hit", "memory") == [Hit("memory/a.md", 1, "hit m")]


def test_grep_fan_out_is_capped(tmp_path: Path) -> None:
    one = WorkspaceFileSystem(tmp_path / "one")
    two = WorkspaceFileSystem(tmp_path / "two")
    composite = CompositeFileSystem(one, {"r": two}, max_grep_hits=3)
    composite.write("a", "x\nx")
    composite.write("r/b", "x\nx")
    assert len(composite.grep("x")) == 3


def test_rename_across_backends_fails_loud(composite: CompositeFileSystem) -> None:
    composite.write("notes.md", "n")
    composite.write("memory/a.md", "m")
    message = (
        "cross-backend rename is not supported: notes.md -> memory/notes.md "
        "(source and destination route to different backends)"
    )
    assert (
        run_file_tool(composite, "rename", {"old_path": "notes.md", "new_path": "memory/notes.md"})
        == f"Error: {message}"
    )
    assert composite.read("notes.md") == "n"
    composite.rename("memory/a.md", "memory/b.md")
    assert composite.read("memory/b.md") == "m"
    # `memory` itself holds a routed sub-tree: moving it would split it across backends
    with pytest.raises(WorkspaceError, match="cross-backend rename is not supported: memory -> m2"):
        composite.rename("memory", "m2")


def test_route_keys_are_validated(stores: tuple[WorkspaceFileSystem, ...]) -> None:
    default, memory, deep = stores
    with pytest.raises(ValueError, match="duplicate filesystem route: memory"):
        CompositeFileSystem(default, {"memory": memory, "memory/": deep})
    with pytest.raises(ValueError, match="invalid filesystem route"):
        CompositeFileSystem(default, {"../x": memory})
    with pytest.raises(ValueError, match="invalid filesystem route"):
        CompositeFileSystem(default, {"": memory})


def test_blank_and_hostile_paths_are_rejected_before_routing(composite: CompositeFileSystem) -> None:
    with pytest.raises(WorkspaceError, match="path must not be blank"):
        composite.read("  ")
    with pytest.raises(WorkspaceError, match=r"illegal segment \('\.\.'\)"):
        composite.write("memory/../../x", "x")
    with pytest.raises(WorkspaceError, match=r"illegal segment \('\.\.'\)"):
        composite.rename("memory/a", "../x")


# ---- provider


def test_conversations_are_isolated_and_lazy(tmp_path: Path) -> None:
    provider = ConversationStores(tmp_path / "owner")
    first = provider.for_conversation("c1")
    second = provider.for_conversation("c2")
    assert provider.for_conversation("c1") is first
    assert first.ls() == []
    assert run_file_tool(first, "read_file", {"path": "a"}) == "Error: File not found: a"
    assert provider.conversations() == []
    assert not (tmp_path / "owner").exists()
    first.write("a", "one")
    assert (tmp_path / "owner" / "files" / "c1" / "a").read_text() == "one"
    assert second.ls() == []
    assert provider.conversations() == ["c1"]


@pytest.mark.parametrize(
    ("conversation_id", "message"),
    [
        ("", "conversation id must not be blank"),
        ("  ", "conversation id must not be blank"),
        ("a/b", "conversation id contains illegal path characters: a/b"),
        ("a\\b", "conversation id contains illegal path characters: a\\b"),
        ("..", "conversation id contains illegal path characters: .."),
        ("a..b", "conversation id contains illegal path characters: a..b"),
        (".", "conversation id contains illegal path characters: ."),
        ("ｃ1", "conversation id contains illegal path characters: ｃ1"),  # not NFKC-stable
        ("c\n1", "conversation id contains illegal path characters: c\\n1"),
    ],
)
def test_conversation_ids_are_one_segment(tmp_path: Path, conversation_id: str, message: str) -> None:
    provider = ConversationStores(tmp_path / "owner")
    with pytest.raises(WorkspaceError) as info:
        provider.for_conversation(conversation_id)
    assert str(info.value) == message


def test_view_cache_is_lru(tmp_path: Path) -> None:
    provider = ConversationStores(tmp_path / "owner", cache_size=2)
    first = provider.for_conversation("c1")
    first.write("a", "kept")
    provider.for_conversation("c2")
    provider.for_conversation("c1")  # refresh c1
    provider.for_conversation("c3")  # evicts c2's view, not c1's
    assert provider.for_conversation("c1") is first
    rebuilt = provider.for_conversation("c2")
    assert rebuilt.ls() == []
    del first
    provider.for_conversation("c4")
    provider.for_conversation("c5")
    assert provider.for_conversation("c1").read("a") == "kept"  # an evicted view loses nothing


def _age(path: Path, seconds_ago: float) -> None:
    stamp = os.stat(path).st_mtime - seconds_ago
    os.utime(path, (stamp, stamp))


def test_conversation_cap_evicts_least_recently_modified_idle_stores(tmp_path: Path) -> None:
    files = tmp_path / "owner" / "files"
    provider = ConversationStores(tmp_path / "owner", Limits(max_conversations=2), cache_size=1)
    provider.for_conversation("old").write("a", "1")
    provider.for_conversation("new").write("a", "1")  # the cache now holds only "new"
    gc.collect()
    _age(files / "old", 100)
    _age(files / "new", 50)
    provider.for_conversation("third").write("a", "1")
    assert provider.conversations() == ["new", "third"]


def test_conversation_cap_spares_live_stores(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    files = tmp_path / "owner" / "files"
    provider = ConversationStores(tmp_path / "owner", Limits(max_conversations=2), cache_size=1)
    held = provider.for_conversation("old")  # a session still holds this view: it is live
    held.write("a", "1")
    provider.for_conversation("new").write("a", "1")
    gc.collect()
    _age(files / "old", 100)
    _age(files / "new", 50)
    provider.for_conversation("third").write("a", "1")
    assert provider.conversations() == ["old", "third"]
    assert held.read("a") == "1"
    pinned = [provider.for_conversation(name) for name in ("old", "third")]
    with caplog.at_level(logging.WARNING):
        provider.for_conversation("fourth").write("a", "1")  # both others live: over the cap, loudly
    assert provider.conversations() == ["fourth", "old", "third"]
    assert "over the 2-store cap" in caplog.text
    assert len(pinned) == 2


def test_touch_on_write_orders_eviction(tmp_path: Path) -> None:
    files = tmp_path / "owner" / "files"
    provider = ConversationStores(tmp_path / "owner", Limits(max_conversations=2), cache_size=1)
    provider.for_conversation("a").write("deep/x", "1")
    provider.for_conversation("b").write("x", "1")
    _age(files / "a", 100)
    _age(files / "b", 50)
    provider.for_conversation("a").write("deep/x", "2")  # a nested write still bumps the store's mtime
    provider.for_conversation("b")  # cache "b", so "a" is idle again
    gc.collect()
    provider.for_conversation("c").write("x", "1")
    assert provider.conversations() == ["a", "c"]


def test_drop_conversation(tmp_path: Path) -> None:
    provider = ConversationStores(tmp_path / "owner")
    view = provider.for_conversation("sub-1")
    view.write("tree/a", "12345")
    assert view.usage() == (1, 5)
    assert provider.drop_conversation("sub-1") is True
    assert provider.drop_conversation("sub-1") is False
    assert provider.conversations() == []
    assert view.usage() == (0, 0)  # accounting forgotten with the files
    fresh = provider.for_conversation("sub-1")
    assert fresh is not view
    assert fresh.ls() == []
    with pytest.raises(WorkspaceError):
        provider.drop_conversation("../owner")


def test_routes_are_shared_across_conversations(tmp_path: Path) -> None:
    provider = ConversationStores(tmp_path / "owner", routes={"memory/": tmp_path / "durable"})
    first = provider.for_conversation("c1")
    second = provider.for_conversation("c2")
    first.write("memory/facts.md", "the sky is blue")
    first.write("scratch.md", "mine")
    assert second.read("memory/facts.md") == "the sky is blue"
    assert run_file_tool(second, "read_file", {"path": "scratch.md"}) == "Error: File not found: scratch.md"
    assert (tmp_path / "durable" / "files" / "shared" / "memory" / "facts.md").exists()
    assert second.ls() == [Entry("memory", 0, True)]


def test_route_root_is_not_a_conversation(tmp_path: Path) -> None:
    provider = ConversationStores(tmp_path / "owner", routes={"memory": tmp_path / "owner"})
    provider.for_conversation("c1").write("memory/x", "1")
    provider.for_conversation("c1").write("y", "1")
    assert provider.conversations() == ["c1"]


def test_provider_rejects_bad_routes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="duplicate filesystem route"):
        ConversationStores(tmp_path, routes={"a": tmp_path / "x", "a/": tmp_path / "y"})


# ---- routes, owners, roots


def test_parse_routes(caplog: pytest.LogCaptureFixture) -> None:
    assert parse_routes("memory/=/var/agent-memory, shared/ = /var/agent-shared") == {
        "memory": Path("/var/agent-memory"),
        "shared": Path("/var/agent-shared"),
    }
    assert parse_routes(None) == {}
    assert parse_routes("  ") == {}
    with caplog.at_level(logging.WARNING):
        parsed = parse_routes("novalue,=x,a=,../up=/d,ok=/d,ok/=/e,,a/b=/f")
    assert parsed == {"ok": Path("/d"), "a/b": Path("/f")}
    assert caplog.text.count("Skipping") == 5


@pytest.mark.parametrize(
    ("owner", "expected"),
    [
        ("research", "research"),
        ("  /atmosphere/agent/research ", "atmosphere-agent-research"),
        ("\\\\x", "x"),
        ("a b/c:d", "a-b-c-d"),
        ("héllo", "h-llo"),
        ("...", "default"),
        ("-.-", "default"),
        ("", "default"),
        ("/", "default"),
        ("v1.2_x-y", "v1.2_x-y"),
    ],
)
def test_sanitize_owner(owner: str, expected: str) -> None:
    assert sanitize_owner(owner) == expected
