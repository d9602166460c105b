"""Quotas and eviction count per user: one user's conversations never make room for another's."""

from __future__ import annotations

import gc
import os
from pathlib import Path

from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.tool.v1.tool_pb2 import WorkspaceScope
from atmosphere.memory.plans import AgentPlan, PlanStatus, PlanStep
from atmosphere.memory.planstore import PlanKey, PlanStore
from atmosphere.memory.vfs.conversation_stores import ConversationStores
from atmosphere.memory.vfs.filestore import DEFAULT_LIMITS, Limits
from atmosphere.memory.workspaces import Workspaces
from atmosphere.service import scoped_conversation

ADA = Principal(user_id="ada")
BOB = Principal(user_id="bob")
PLAN = AgentPlan((PlanStep("step", PlanStatus.PENDING, ""),), "goal")


def ada(conversation: str) -> str:
    return scoped_conversation(conversation, ADA)


def bob(conversation: str) -> str:
    return scoped_conversation(conversation, BOB)


def _age(path: Path, seconds_ago: float) -> None:
    stamp = os.stat(path).st_mtime - seconds_ago
    os.utime(path, (stamp, stamp))


def test_a_user_at_the_conversation_cap_evicts_only_their_own_stores(tmp_path: Path) -> None:
    provider = ConversationStores(tmp_path / "owner", Limits(max_conversations=2), cache_size=1)
    provider.for_conversation(ada("oldest")).write("a", "ada's")
    gc.collect()
    _age(tmp_path / "owner" / "files" / ada("oldest"), 1000)  # the oldest store of all
    for i in range(5):
        provider.for_conversation(bob(f"c{i}")).write("a", "bob's")
        gc.collect()
    assert provider.for_conversation(ada("oldest")).read("a") == "ada's"
    assert sorted(provider.conversations()) == sorted([ada("oldest"), bob("c3"), bob("c4")])


def test_anonymous_conversations_share_one_quota_apart_from_users(tmp_path: Path) -> None:
    provider = ConversationStores(tmp_path / "owner", Limits(max_conversations=1), cache_size=1)
    provider.for_conversation(ada("mine")).write("a", "1")
    provider.for_conversation("anon-1").write("a", "1")
    gc.collect()
    provider.for_conversation("anon-2").write("a", "1")
    assert sorted(provider.conversations()) == sorted([ada("mine"), "anon-2"])


def test_260_conversations_of_one_user_leave_another_users_files_alone(tmp_path: Path) -> None:
    workspaces = Workspaces(tmp_path)

    def scope(conversation: str) -> WorkspaceScope:
        return WorkspaceScope(category="agents", owner="coder", agent_id="coder", conversation_id=conversation)

    workspaces.files(scope(ada("notes"))).write("notes.md", "ada's notes")
    gc.collect()
    for i in range(DEFAULT_LIMITS.max_conversations + 4):
        workspaces.files(scope(bob(f"flood-{i}"))).write("x", "x")
    gc.collect()
    assert workspaces.files(scope(ada("notes"))).read("notes.md") == "ada's notes"
    conversations = workspaces._stores(scope(ada("notes")))[1].conversations()
    assert sum(c.startswith(bob("")) for c in conversations) == DEFAULT_LIMITS.max_conversations


def test_a_user_at_the_plan_cap_evicts_only_their_own_plans(tmp_path: Path) -> None:
    store = PlanStore(tmp_path, max_plan_files=2)
    store.put("coder", ada("trip"), PLAN)
    os.utime(store.path_of("coder", ada("trip")), (1_600_000_000, 1_600_000_000))  # the oldest plan of all
    for i in range(4):
        store.put("coder", bob(f"p{i}"), PLAN)
    assert store.get("coder", ada("trip")) == PLAN
    assert len([k for k in store.list() if k.conversation_id.startswith(bob(""))]) == 2
    assert PlanKey("coder", ada("trip")) in store.list()
