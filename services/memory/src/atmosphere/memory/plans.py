"""The planning floor: running the `write_todos` tool, its plan model and the file-backed plan store.

The tool as the model sees it (name, description, argument schema) is the SDK's
`atmosphere.sdk.builtin_tools.WRITE_TODOS`, the one definition dispatch offers; this module runs it.
Each `write_todos` call replaces the FULL todo list of one agent and conversation. The plan is kept
as one JSON document at `{owner_root}/plans/{agentId}/{conversationId}.json`, rendered back to the
model as a Markdown checklist, and published to consoles as a `plan-update` event (`plan_wire`).

Everything the model sends is validated here and never raises back at it: `run_write_todos` turns
every validation or bounds problem into `write_todos failed: <message>`.
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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple

from atmosphere.memory.dirfd import DIR_FLAGS, read_all, replace_atomically

log = logging.getLogger("atmosphere.memory.plans")

MAX_STEPS = 256
"""Steps one stored plan may carry."""
MAX_PLAN_BYTES = 128 * 1024
"""Serialized (UTF-8) size of one plan document."""
MAX_PLAN_FILES = 1024
"""Plan documents one store keeps; writing a new one at the cap evicts the least recently modified."""
MAX_CACHED_LOCKS = 256
"""Per-file write locks kept (keys come from external input, so the cache is bounded)."""

UNAVAILABLE = "write_todos unavailable: no plan store is bound to this session."
_FAILED = "write_todos failed: "
_TODOS_REQUIRED = "'todos' is required and must be an array of {content, status, activeForm}"
_TODO_NOT_OBJECT = "each todo must be an object with 'content' and 'status'"
_TODO_NO_CONTENT = "each todo needs a non-empty 'content'"


class PlanError(Exception):
    """A plan, a plan key or a plan write the store refuses; the message is fit for the model."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class PlanStatus(Enum):
    """The lifecycle of one step; the value is the wire spelling, the name the on-disk one."""

    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    ABANDONED = "abandoned"

    @classmethod
    def parse(cls, text: str | None) -> PlanStatus:
        """Leniently parse a model-written status: case-insensitive, trimmed; unknown or blank is PENDING.

        The value comes from model output, so a surprising spelling must degrade, not fail.
        """
        if text is None:
            return cls.PENDING
        return _STATUS_ALIASES.get(text.strip().lower(), cls.PENDING)


_STATUS_ALIASES: dict[str, PlanStatus] = {
    **dict.fromkeys(("in_progress", "in-progress", "inprogress", "active", "doing"), PlanStatus.IN_PROGRESS),
    **dict.fromkeys(("completed", "complete", "done", "finished"), PlanStatus.COMPLETED),
    **dict.fromkeys(("abandoned", "cancelled", "canceled", "skipped"), PlanStatus.ABANDONED),
}

_MARKERS = {
    PlanStatus.PENDING: "[ ]",
    PlanStatus.IN_PROGRESS: "[~]",
    PlanStatus.COMPLETED: "[x]",
    PlanStatus.ABANDONED: "[-]",
}


@dataclass(frozen=True, slots=True)
class PlanStep:
    """One step of a plan."""

    content: str
    """What the step is, in the imperative ("Run tests"); never blank."""
    status: PlanStatus = PlanStatus.PENDING
    active_form: str = ""
    """Present-continuous label shown while in progress ("Running tests"); blank when absent."""

    def __post_init__(self) -> None:
        """Refuse a blank step: it would render as an empty checklist line."""
        if not self.content.strip():
            raise PlanError("step content must not be blank")


@dataclass(frozen=True, slots=True)
class AgentPlan:
    """An agent's plan: ordered steps and an optional goal. Immutable; every write replaces it whole."""

    steps: tuple[PlanStep, ...] = ()
    goal: str | None = None
    """A blank goal is normalized to `None`."""

    def __post_init__(self) -> None:
        """Normalize so every consumer (markdown, wire, disk) sees one shape."""
        object.__setattr__(self, "steps", tuple(self.steps))
        if self.goal is not None and not self.goal.strip():
            object.__setattr__(self, "goal", None)


def _stringify(value: object) -> str | None:
    """A model-sent value as text: strings as-is, JSON scalars/containers in their JSON spelling."""
    if value is None or isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return None  # not JSON-shaped: treated as absent (a missing content is then reported)


def _coerce_todos(raw: object) -> object:
    """Decode a `todos` the model double-encoded as a JSON string; anything else passes through."""
    if isinstance(raw, str) and raw.strip():
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            return raw
    return raw


def parse_write_todos(arguments: Mapping[str, object] | None) -> AgentPlan:
    """Parse `write_todos` arguments: lenient on shape, strict on structure.

    Raises:
        PlanError: `todos` is missing or not an array, an item is not an object, or has no content.
    """
    args: Mapping[str, object] = arguments if arguments is not None else {}
    todos = _coerce_todos(args.get("todos"))
    if not isinstance(todos, list):
        raise PlanError(_TODOS_REQUIRED)
    steps: list[PlanStep] = []
    for item in todos:
        if not isinstance(item, Mapping):
            raise PlanError(_TODO_NOT_OBJECT)
        content = _stringify(item.get("content"))
        if content is None or not content.strip():
            raise PlanError(_TODO_NO_CONTENT)
        status = PlanStatus.parse(_stringify(item.get("status")))
        steps.append(PlanStep(content, status, _stringify(item.get("activeForm")) or ""))
    return AgentPlan(tuple(steps), _stringify(args.get("goal")))


def render_markdown(plan: AgentPlan) -> str:
    """The plan as the Markdown checklist `write_todos` returns, so the model sees what it wrote."""
    lines = [f"Goal: {plan.goal}"] if plan.goal else []
    if not plan.steps:
        lines.append("(no steps)")
    for step in plan.steps:
        shown = step.active_form if step.status is PlanStatus.IN_PROGRESS and step.active_form.strip() else step.content
        lines.append(f"- {_MARKERS[step.status]} {shown}")
    return "\n".join(lines)


def _wire_steps(plan: AgentPlan) -> list[dict[str, str]]:
    steps: list[dict[str, str]] = []
    for step in plan.steps:
        entry = {"content": step.content, "status": step.status.value}
        if step.active_form.strip():
            entry["activeForm"] = step.active_form
        steps.append(entry)
    return steps


def plan_wire(plan: AgentPlan, conversation_id: str, agent_id: str) -> dict[str, Any]:
    """The `data` of a `plan-update` event.

    The ids are the store keys: the event's own `sessionId` is the per-prompt stream, not the conversation.
    """
    return {"steps": _wire_steps(plan), "goal": plan.goal, "conversationId": conversation_id, "agentId": agent_id}


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
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(parent_fd, name):
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
                        # modified plans instead of refusing every new conversation forever.
                        self._evict_for_one_more()
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

    def _evict_for_one_more(self) -> None:
        """Delete least-recently-modified plan files until one more fits under the cap."""
        files = sorted((mtime, agent, name) for agent in self._agents() for name, mtime in self._plan_files(agent))
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


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


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


def run_write_todos(
    store: PlanStore | None, agent_id: str, conversation_id: str, arguments: object
) -> tuple[str, AgentPlan | None]:
    """Execute a `write_todos` call: the text for the model, and the stored plan (`None` on failure).

    `arguments` is the decoded arguments object, or its JSON text. Never raises for bad input;
    the caller emits `plan-update` (`plan_wire`) when a plan comes back.
    """
    if store is None:
        return UNAVAILABLE, None
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            arguments = None
    try:
        plan = parse_write_todos(arguments if isinstance(arguments, Mapping) else None)
        store.put(agent_id, conversation_id, plan)
    except PlanError as exc:
        return _FAILED + exc.message, None
    return render_markdown(plan), plan


__all__ = [
    "MAX_PLAN_BYTES",
    "MAX_PLAN_FILES",
    "MAX_STEPS",
    "UNAVAILABLE",
    "AgentPlan",
    "PlanError",
    "PlanKey",
    "PlanStatus",
    "PlanStep",
    "PlanStore",
    "parse_write_todos",
    "plan_wire",
    "render_markdown",
    "run_write_todos",
]
