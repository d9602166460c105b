"""From a `WorkspaceScope` on the wire to the plan store and file store it names.

Layout (the harness page's): `{root}/{agents|coordinators|endpoints}/{owner}/plans/...` and
`.../files/{conversation}/`; a `task` sub-agent's ephemeral workspace is
`{root}/subagents/{spawn id}/`, removed when the sub-run ends. One store object per owner
root (bounded, least recently used first), so every call of an owner shares its locks.
"""

from __future__ import annotations

import re
import shutil
import threading
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

from atmosphere.contracts.tool.v1.tool_pb2 import WorkspaceScope
from atmosphere.memory.planstore import PlanStore
from atmosphere.memory.vfs import (
    DEFAULT_LIMITS,
    ConversationStores,
    FileSystem,
    Limits,
    WorkspaceError,
    check_conversation_id,
    sanitize_owner,
)

CATEGORIES = frozenset({"agents", "coordinators", "endpoints", "subagents"})
EPHEMERAL = "subagents"
MAX_OWNERS = 1024
_SPAWN_ID = re.compile(r"[0-9a-f]{32}")


class Workspaces:
    """Plan stores and conversation file stores by owner."""

    def __init__(
        self, root: Path, *, routes: Mapping[str, Path] | None = None, limits: Limits = DEFAULT_LIMITS
    ) -> None:
        """Serve workspaces under `root`; `routes` are composite file routes (`LLM_FILESYSTEM_ROUTES`)."""
        self._root = Path(root)
        self._routes = dict(routes or {})
        self._limits = limits
        self._lock = threading.Lock()
        self._owners: OrderedDict[Path, tuple[PlanStore, ConversationStores]] = OrderedDict()

    @property
    def root(self) -> Path:
        """The workspace root."""
        return self._root

    def owner_root(self, scope: WorkspaceScope) -> Path:
        """The owner directory a scope names; `WorkspaceError` for a malformed scope."""
        if scope.category not in CATEGORIES:
            msg = f"unknown workspace category {scope.category!r}"
            raise WorkspaceError(msg)
        if scope.category == EPHEMERAL and not _SPAWN_ID.fullmatch(scope.owner):
            msg = "a sub-agent workspace is named by its spawn id"
            raise WorkspaceError(msg)
        return self._root / scope.category / sanitize_owner(scope.owner)

    def _stores(self, scope: WorkspaceScope) -> tuple[PlanStore, ConversationStores]:
        root = self.owner_root(scope)
        with self._lock:
            stores = self._owners.get(root)
            if stores is None:
                # Ephemeral sub-agent workspaces never see the shared routes: they are isolated.
                routes = {} if scope.category == EPHEMERAL else self._routes
                stores = (PlanStore(root), ConversationStores(root, self._limits, routes))
                self._owners[root] = stores
                while len(self._owners) > MAX_OWNERS:
                    self._owners.popitem(last=False)  # state is on disk; a later call rebuilds it
            else:
                self._owners.move_to_end(root)
            return stores

    def plans(self, scope: WorkspaceScope) -> PlanStore:
        """The plan store of the scope's owner."""
        return self._stores(scope)[0]

    def files(self, scope: WorkspaceScope) -> FileSystem:
        """The file store one conversation of the scope's owner sees."""
        return self._stores(scope)[1].for_conversation(check_conversation_id(scope.conversation_id))

    def drop(self, scope: WorkspaceScope, *, conversation_only: bool) -> bool:
        """Remove a conversation's plans and files, or a whole ephemeral workspace; whether any existed."""
        root = self.owner_root(scope)
        if not conversation_only:
            if scope.category != EPHEMERAL:
                msg = "only an ephemeral sub-agent workspace can be removed whole"
                raise WorkspaceError(msg)
            with self._lock:
                self._owners.pop(root, None)
            existed = root.exists()
            shutil.rmtree(root, ignore_errors=True)
            return existed
        conversation = check_conversation_id(scope.conversation_id)
        plans, files = self._stores(scope)
        dropped_plans = plans.drop_conversation(conversation)
        dropped_files = files.drop_conversation(conversation)
        return bool(dropped_plans) or dropped_files
