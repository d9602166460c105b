"""The file-backed plan store: one JSON document per agent and conversation, never via a link.

Layout `{owner_root}/plans/{agentId}/{conversationId}.json`; the plan model and the
`write_todos` tool that fills the store are in `atmosphere.memory.plans`.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import json
import logging
import os
import secrets
import stat
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from atmosphere.memory.plans import MAX_STEPS, AgentPlan, PlanError, PlanStatus, PlanStep
from atmosphere.memory.vfs import DIR_FLAGS, is_link_at, read_all, replace_atomically
from atmosphere.service import conversation_user_key

log = logging.getLogger("atmosphere.memory.plans")

MAX_PLAN_BYTES = 128 * 1024
"""Serialized (UTF-8) size of one plan document."""
MAX_PLAN_FILES = 1024
"""Plan documents one store keeps per user; a user's new one at the cap evicts their least recently modified."""
MAX_CACHED_LOCKS = 256
"""Per-file write locks kept (keys come from external input, so the cache is bounded)."""


def _document(plan: AgentPlan) -> bytes:
    steps = [{"content": s.content, "status": s.status.name, "activeForm": s.active_form or None} for s in plan.steps]
    return json.dumps({"goal": plan.goal, "steps": steps}, ensure_ascii=False, separators=(",", ":")).encode()


def _from_document(raw: bytes) -> AgentPlan:
    """Decode a stored document; any deviation from the written shape raises (ValueError/TypeError/KeyError)."""
    doc = json.loads(raw)
    goal = doc.get("goal")
    if goal is not None and not isinstance(goal, str):
        raise TypeError("goal")
    steps: list[PlanStep] = []
    for item in doc["steps"]:
        content, status, active = item["content"], item.get("status"), item.get("activeForm")
        if not isinstance(content, str) or not isinstance(active, str | None):
            raise TypeError("step")
        steps.append(PlanStep(content, PlanStatus[status] if status is not None else PlanStatus.PENDING, active or ""))
    return AgentPlan(tuple(steps), goal)


def _validate_segment(label: str, value: str) -> str:
    if not value or not value.strip():
        raise PlanError(f"{label} must not be blank")
    # "." and NUL are refused too: "." would alias the parent directory, NUL cannot be a file name.
    if "/" in value or "\\" in value or ".." in value or "\x00" in value or value == ".":
        raise PlanError(f"{label} contains illegal path characters: {value}")
    return value


def _is_valid_segment(value: str) -> bool:
    try:
        _validate_segment("key", value)
    except PlanError:
        return False
    return True


class PlanKey(NamedTuple):
    """Where a plan lives: one agent and conversation."""

    agent_id: str
    conversation_id: str


class PlanStore:
    """The file-backed plan store (Atmosphere's `FileSystemAgentPlanStore`).

    Layout: `{owner_root}/plans/{agentId}/{conversationId}.json`, the `plans` tree created lazily.
    The document is `{"goal": ..., "steps": [{"content", "status" (enum NAME), "activeForm"}]}`.

    Thread-safe and blocking (the service calls it through `asyncio.to_thread`): writes to one plan
    are serialized by a per-file lock from a bounded LRU; reads take no lock and never see a torn
    document, because every write is a same-directory temp file (`.plan-*.tmp`), fsync, `os.replace`.

    Symbolic links are never followed below `owner_root`: every path component under it is opened
    relative to its parent's descriptor with `O_NOFOLLOW`, so a `plans` dir, agent dir or plan file
    that is a link (possibly pointing out of the workspace) is refused on write, reads as no plan,
    and is skipped by listings and eviction. Doing it with descriptors rather than an `lstat`
    check leaves no window between the check and the use. `owner_root` itself is trusted
    configuration and may be a link. This needs POSIX `dir_fd` support (Linux, macOS).
    """

    def __init__(self, owner_root: Path, *, max_plan_files: int = MAX_PLAN_FILES) -> None:
        """Keep plans under `owner_root`; `max_plan_files` lowers the file cap (for tests)."""
        if max_plan_files < 1:
            raise ValueError(f"max_plan_files must be at least 1, not {max_plan_files}")
        self._root = Path(os.path.abspath(owner_root))
        self._plans_dir = self._root / "plans"
        self._max_plan_files = max_plan_files
        self._locks: OrderedDict[PlanKey, threading.Lock] = OrderedDict()
        self._locks_guard = threading.Lock()
        # Held while a NEW plan file is counted, room is made and the file created, so two new
        # conversations racing at the cap cannot both see room (or both evict).
        self._create_lock = threading.Lock()

    @property
    def root(self) -> Path:
        """The owner root the store lives under."""
        return self._root

    def path_of(self, agent_id: str, conversation_id: str) -> Path:
        """The document path of a plan key (validated; the file need not exist)."""
        agent = _validate_segment("agentId", agent_id)
        conversation = _validate_segment("conversationId", conversation_id)
        path = Path(os.path.normpath(self._plans_dir / agent / f"{conversation}.json"))
        if not path.is_relative_to(self._plans_dir):
            raise PlanError(f"Path escapes workspace: {path}")
        return path

    # -- descriptors -------------------------------------------------------------------------

    def _open_child_dir(self, parent_fd: int, name: str, shown: str, *, create: bool) -> int | None:
        """Open `name` under `parent_fd` without following a link; `None` when absent and not created.

        `shown` is the path relative to the owner root, for messages (the model sees them).
        """
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, dir_fd=parent_fd)
        try:
            return os.open(name, DIR_FLAGS, dir_fd=parent_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) and is_link_at(parent_fd, name):
                raise PlanError(f"Path escapes workspace: {shown} is a symbolic link") from exc
            raise

    @contextlib.contextmanager
    def _agent_dir(self, agent: str, *, create: bool) -> Iterator[int | None]:
        """The descriptor of `plans/{agent}`, or `None` when it does not exist (and `create` is false)."""
        if create:
            self._root.mkdir(parents=True, exist_ok=True)
        try:
            root_fd = os.open(self._root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            yield None
            return
        plans_fd = agent_fd = None
        try:
            plans_fd = self._open_child_dir(root_fd, "plans", "plans", create=create)
            if plans_fd is not None:
                agent_fd = self._open_child_dir(plans_fd, agent, f"plans/{agent}", create=create)
            yield agent_fd
        finally:
            for fd in (agent_fd, plans_fd, root_fd):
                if fd is not None:
                    os.close(fd)

    def _lock_for(self, key: PlanKey) -> threading.Lock:
        # An evicted lock may still be held; a second writer of that key can then race the first.
        # That is harmless: both write whole documents atomically, so the last one wins, never torn.
        with self._locks_guard:
            lock = self._locks.get(key)
            if lock is None:
                lock = self._locks[key] = threading.Lock()
                while len(self._locks) > MAX_CACHED_LOCKS:
                    self._locks.popitem(last=False)
            else:
                self._locks.move_to_end(key)
            return lock

    # -- operations --------------------------------------------------------------------------

    def get(self, agent_id: str, conversation_id: str) -> AgentPlan | None:
        """The stored plan, or `None` when there is none or it is corrupt, unreadable or a link.

        Raises:
            PlanError: a key is blank or path-shaped.
        """
        path = self.path_of(agent_id, conversation_id)
        try:
            with self._agent_dir(agent_id, create=False) as agent_fd:
                if agent_fd is None:
                    return None
                raw = _read_bounded(agent_fd, path.name)
        except FileNotFoundError:
            return None
        except (OSError, PlanError) as exc:
            log.warning("unreadable plan %s: %s", path, exc)
            return None
        try:
            return _from_document(raw)
        except (ValueError, TypeError, KeyError, AttributeError, PlanError) as exc:
            log.warning("corrupt plan %s: %s", path, exc)
            return None

    def put(self, agent_id: str, conversation_id: str, plan: AgentPlan) -> None:
        """Replace the plan of an agent and conversation.

        Raises:
            PlanError: too many steps, too many bytes, an invalid key, a linked path, or an I/O failure.
        """
        if len(plan.steps) > MAX_STEPS:
            raise PlanError(f"plan rejected: {len(plan.steps)} steps exceeds the {MAX_STEPS}-step limit")
        data = _document(plan)
        if len(data) > MAX_PLAN_BYTES:
            raise PlanError(f"plan rejected: {len(data)} bytes exceeds the {MAX_PLAN_BYTES}-byte limit")
        path = self.path_of(agent_id, conversation_id)
        try:
            with self._lock_for(PlanKey(agent_id, conversation_id)):
                if self._exists(agent_id, path.name):
                    self._write(agent_id, path.name, data)
                else:
                    with self._create_lock:
                        # Bounded, never bricked: make room by evicting the least recently
                        # modified plans (of this user) instead of refusing every new conversation.
                        self._evict_for_one_more(conversation_user_key(conversation_id))
                        self._write(agent_id, path.name, data)
        except OSError as exc:
            raise PlanError(f"Failed to persist plan {agent_id}/{conversation_id}: {exc.strerror or exc}") from exc

    def delete(self, agent_id: str, conversation_id: str) -> bool:
        """Delete one plan; whether there was one.

        Raises:
            PlanError: an invalid key, a linked directory, or an I/O failure.
        """
        path = self.path_of(agent_id, conversation_id)
        try:
            with (
                self._lock_for(PlanKey(agent_id, conversation_id)),
                self._agent_dir(agent_id, create=False) as agent_fd,
            ):
                if agent_fd is None:
                    return False
                os.unlink(path.name, dir_fd=agent_fd)  # unlinks a link itself, never its target
                return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise PlanError(f"Failed to delete plan {agent_id}/{conversation_id}: {exc.strerror or exc}") from exc

    def drop_conversation(self, conversation_id: str) -> int:
        """Delete every agent's plan for a conversation; how many were deleted."""
        _validate_segment("conversationId", conversation_id)
        return sum(self.delete(agent, conversation_id) for agent in self._agents())

    def list(self, agent_id: str | None = None) -> builtins.list[PlanKey]:
        """The keys of the stored plans (of one agent, or all), sorted."""
        agents = [_validate_segment("agentId", agent_id)] if agent_id is not None else self._agents()
        keys = [PlanKey(agent, name[: -len(".json")]) for agent in agents for name, _ in self._plan_files(agent)]
        return sorted(key for key in keys if _is_valid_segment(key.conversation_id))

    # -- helpers -----------------------------------------------------------------------------

    def _exists(self, agent: str, name: str) -> bool:
        with self._agent_dir(agent, create=False) as agent_fd:
            if agent_fd is None:
                return False
            try:
                mode = os.stat(name, dir_fd=agent_fd, follow_symlinks=False).st_mode
            except FileNotFoundError:
                return False
        if stat.S_ISLNK(mode):
            raise PlanError(f"Path escapes workspace: plans/{agent}/{name} is a symbolic link")
        return True

    def _write(self, agent: str, name: str, data: bytes) -> None:
        with self._agent_dir(agent, create=True) as agent_fd:
            assert agent_fd is not None  # created above
            temp = f".plan-{secrets.token_hex(8)}.tmp"
            replace_atomically(agent_fd, name, data, temp=temp, mode=0o600, sync_dir=True)

    def _agents(self) -> builtins.list[str]:
        """Agent directories under `plans` (real directories only, links skipped)."""
        try:
            root_fd = os.open(self._root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return []
        try:
            plans_fd = self._open_child_dir(root_fd, "plans", "plans", create=False)
        except PlanError:
            return []
        finally:
            os.close(root_fd)
        if plans_fd is None:
            return []
        try:
            with os.scandir(plans_fd) as entries:
                names = (e.name for e in entries if e.is_dir(follow_symlinks=False))
                return sorted(name for name in names if _is_valid_segment(name))
        finally:
            os.close(plans_fd)

    def _plan_files(self, agent: str) -> builtins.list[tuple[str, int]]:
        """`(file name, mtime ns)` of one agent's plan documents (regular files only)."""
        try:
            with self._agent_dir(agent, create=False) as agent_fd:
                if agent_fd is None:
                    return []
                with os.scandir(agent_fd) as entries:
                    return [
                        (e.name, e.stat(follow_symlinks=False).st_mtime_ns)
                        for e in entries
                        if e.name.endswith(".json") and e.is_file(follow_symlinks=False)
                    ]
        except (OSError, PlanError) as exc:
            log.warning("cannot list plans of %s: %s", agent, exc)
            return []

    def _evict_for_one_more(self, user: str) -> None:
        """Delete `user`'s least-recently-modified plan files until one more of theirs fits under the cap.

        The cap counts per user (`conversation_user_key`), so one user's plans never evict another's.
        """
        files = sorted(
            (mtime, agent, name)
            for agent in self._agents()
            for name, mtime in self._plan_files(agent)
            if conversation_user_key(name.removesuffix(".json")) == user
        )
        excess = len(files) - (self._max_plan_files - 1)
        # No per-file locks here: a writer holding one may be waiting for the create lock we hold.
        # Deleting under a concurrent rewrite is benign — the rewrite simply recreates the file.
        for _, agent, name in files[: max(excess, 0)]:
            try:
                with self._agent_dir(agent, create=False) as agent_fd:
                    if agent_fd is not None:
                        os.unlink(name, dir_fd=agent_fd)
                log.info("evicted plan %s/%s (over the %d-plan cap)", agent, name, self._max_plan_files)
            except (OSError, PlanError) as exc:
                log.warning("could not evict plan %s/%s: %s", agent, name, exc)


def _read_bounded(dir_fd: int, name: str) -> bytes:
    """Read a plan file without following a link, refusing anything larger than a plan may be."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PlanError(f"{name} is not a regular file")
        data = read_all(fd, MAX_PLAN_BYTES + 1)
        if len(data) > MAX_PLAN_BYTES:
            raise PlanError(f"{name} is over {MAX_PLAN_BYTES} bytes")
        return data
    finally:
        os.close(fd)


__all__ = ["MAX_PLAN_BYTES", "MAX_PLAN_FILES", "PlanKey", "PlanStore"]
