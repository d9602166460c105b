"""Rebuilding a run from its steps, without calling any model (Atmosphere's `TapeReplay`).

* input: the messages of the run's first own `input` step (system prompt, history, user message);
* output: its own `text` steps concatenated in seq order (a sub-agent's `subagent-text` is not
  the run's answer), less what an `ai.run.answer_rewound` marker took back;
* tools: `{name, arguments}` of its own `tool-start` steps, in order (`arguments` as JSON text).

Steps forwarded from a sub-agent (`originRunId` in the payload) and steps whose payload does
not parse are skipped. A tree is the root run and the runs whose `parent_run_id` is the root,
ordered by start time; their own children are not followed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from atmosphere.bus.runs import ANSWER_REWOUND_METADATA_KEY
from atmosphere.tape.store import RunRow, Step, TapeStore

MAX_CHILDREN = 1000
"""Children of one root rebuilt at most (the tree still counts every one)."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool the run called."""

    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Replay:
    """A run as its steps tell it."""

    run: RunRow
    input: list[tuple[str, str]] = field(default_factory=list)
    """(role, content) pairs."""
    output: str = ""
    tools: list[ToolCall] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ReplayTree:
    """A root run and the runs it started."""

    root: Replay
    children: list[Replay]
    child_count: int
    """Every child the tape holds (more than `children` when past `MAX_CHILDREN`)."""


def _payload(step: Step) -> dict[str, Any] | None:
    """`step`'s payload when it is one of the run's own and parses as an object."""
    try:
        data = json.loads(step.payload)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("originRunId"):
        return None
    return data


def _messages(data: dict[str, Any]) -> list[tuple[str, str]]:
    messages = data.get("messages")
    if not isinstance(messages, list):
        return []
    pairs: list[tuple[str, str]] = []
    for message in messages:
        if isinstance(message, dict):
            role, content = message.get("role"), message.get("content")
            pairs.append((role if isinstance(role, str) else "user", content if isinstance(content, str) else ""))
    return pairs


def _rewound(text: str, value: Any) -> str:
    """`text` less the end a resumed run's different answer replaced (`ai.run.answer_rewound`)."""
    discard = value.get("discard") if isinstance(value, dict) else None
    if not isinstance(discard, int) or discard <= 0:
        return text
    return text[: max(0, len(text) - discard)]


def reconstruct(run: RunRow, steps: Iterable[Step]) -> Replay:
    """Rebuild `run` from its steps (in seq order)."""
    messages: list[tuple[str, str]] | None = None
    output: list[str] = []
    tools: list[ToolCall] = []
    for step in steps:
        if step.kind not in ("input", "text", "tool-start", "metadata"):
            continue
        data = _payload(step)
        if data is None:
            continue
        if step.kind == "input" and messages is None:
            messages = _messages(data)
        elif step.kind == "text" and isinstance(data.get("text"), str):
            output.append(data["text"])
        elif step.kind == "metadata" and data.get("key") == ANSWER_REWOUND_METADATA_KEY:
            output[:] = [_rewound("".join(output), data.get("value"))]
        elif step.kind == "tool-start":
            tools.append(ToolCall(str(data.get("toolName", "")), str(data.get("argumentsJson", ""))))
    return Replay(run, messages or [], "".join(output), tools)


async def reconstruct_run(store: TapeStore, run_id: str, *, owner: str = "") -> Replay | None:
    """The run `run_id` rebuilt, or None when the tape has no such run (with `owner`: none of theirs)."""
    run = await store.run(run_id, owner=owner)
    if run is None:
        return None
    return reconstruct(run, await store.replayed_steps(run_id))


async def reconstruct_tree(
    store: TapeStore, root_id: str, *, max_children: int = MAX_CHILDREN, owner: str = ""
) -> ReplayTree | None:
    """The run `root_id` and its children rebuilt, or None when the tape has no such run.

    With `owner`: None unless the root is that owner's, and only that owner's children.
    """
    root = await reconstruct_run(store, root_id, owner=owner)
    if root is None:
        return None
    rows, count = await store.children(root_id, limit=max_children, owner=owner)
    children = [reconstruct(row, await store.replayed_steps(row.run_id)) for row in rows if row.run_id != root_id]
    return ReplayTree(root, children, count - (len(rows) - len(children)))
