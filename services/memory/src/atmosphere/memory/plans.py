"""The planning floor: running the `write_todos` tool and its plan model (the store is `planstore`).

The tool as the model sees it (name, description, argument schema) is the SDK's
`atmosphere.sdk.builtin_tools.WRITE_TODOS`, the one definition dispatch offers; this module runs it.
Each `write_todos` call replaces the FULL todo list of one agent and conversation. The plan is kept
as one JSON document at `{owner_root}/plans/{agentId}/{conversationId}.json`, rendered back to the
model as a Markdown checklist, and published to consoles as a `plan-update` event (`plan_wire`).

Everything the model sends is validated here and never raises back at it: `run_write_todos` turns
every validation or bounds problem into `write_todos failed: <message>`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from atmosphere.sdk.builtin_tools import WRITE_TODOS, unknown_arguments

if TYPE_CHECKING:
    from atmosphere.memory.planstore import PlanStore

MAX_STEPS = 256
"""Steps one stored plan may carry."""

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
        PlanError: an argument it does not take (a model's typo must not pass unnoticed, as it
            would not for a user tool), `todos` is missing or not an array, an item is not an
            object, or has no content.
    """
    args: Mapping[str, object] = arguments if arguments is not None else {}
    unknown = unknown_arguments(WRITE_TODOS, args)
    if unknown is not None:
        raise PlanError(unknown)
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
    "MAX_STEPS",
    "UNAVAILABLE",
    "AgentPlan",
    "PlanError",
    "PlanStatus",
    "PlanStep",
    "parse_write_todos",
    "plan_wire",
    "render_markdown",
    "run_write_todos",
]
