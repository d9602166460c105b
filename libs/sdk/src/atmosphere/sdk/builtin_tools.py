"""The harness's built-in tools as the model sees them: names, descriptions, argument schemas.

One definition, shared by dispatch (which offers them to the model) and the memory service
(which serves the plan and file tools). A user tool with the same name wins over the built-in.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from typing import Any

from atmosphere.sdk._tool import ToolKind
from atmosphere.sdk.runtime import ToolSpec

HARNESS_TOOL_TIMEOUT = 30.0
"""Seconds a plan or file tool may take (they are local disk operations)."""
DELEGATION_TIMEOUT = 120.0
"""Seconds a `delegate_task` or `task` call may take (a whole sub-run)."""


def _schema(properties: dict[str, dict[str, Any]], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


def _string(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


WRITE_TODOS = ToolSpec(
    name="write_todos",
    description=(
        "Create or replace your plan for the current task: a todo list you keep up to date as you work. "
        "Always pass the FULL list (it replaces the previous one). Each item has 'content' (what to do, "
        "imperative), 'status' (pending, in_progress, completed or abandoned) and an optional 'activeForm' "
        "(present continuous, shown while it is in progress). Keep exactly one item in_progress at a time. "
        "Use it for any task with more than one step. Returns the plan as a checklist."
    ),
    parameters=_schema(
        {
            "todos": {
                "type": "array",
                "description": "The full todo list: objects with content, status and optional activeForm.",
                # The original declares no `items`; describing them helps small models produce
                # the right shape and costs nothing (the parser stays lenient either way).
                "items": {
                    "type": "object",
                    "properties": {
                        "content": {"type": "string"},
                        "status": {"type": "string", "enum": ["pending", "in_progress", "completed", "abandoned"]},
                        "activeForm": {"type": "string"},
                    },
                    "required": ["content", "status"],
                },
            },
            "goal": _string("Optional one-line goal of the plan."),
        },
        ["todos"],
    ),
    kind=ToolKind.EDIT,
    idempotent=True,
    timeout=HARNESS_TOOL_TIMEOUT,
)

FILE_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="ls",
        description="List the entries directly under a workspace directory (directories first, then files with sizes).",
        parameters=_schema({"dir": _string("Directory relative to the workspace root; omit or '.' for the root.")}, []),
        kind=ToolKind.READ,
        idempotent=True,
        timeout=HARNESS_TOOL_TIMEOUT,
    ),
    ToolSpec(
        name="read_file",
        description="Read one workspace file's UTF-8 content (a long file in pages, from `offset`).",
        parameters=_schema(
            {
                "path": _string("File path relative to the workspace root."),
                # A file larger than one reply is read in pages; the reply names the offset to go on from.
                "offset": {
                    "type": "integer",
                    "description": "Character offset to start reading at (default 0).",
                },
            },
            ["path"],
        ),
        kind=ToolKind.READ,
        idempotent=True,
        timeout=HARNESS_TOOL_TIMEOUT,
    ),
    ToolSpec(
        name="write_file",
        description="Create or overwrite a workspace file (parent directories are created).",
        parameters=_schema(
            {"path": _string("File path relative to the workspace root."), "content": _string("The full content.")},
            ["path", "content"],
        ),
        kind=ToolKind.EDIT,
        idempotent=True,
        timeout=HARNESS_TOOL_TIMEOUT,
    ),
    ToolSpec(
        name="edit_file",
        description=(
            "Replace one exact occurrence of old_text with new_text in a workspace file; old_text must match "
            "exactly once (include surrounding context to make it unique)."
        ),
        parameters=_schema(
            {
                "path": _string("File path relative to the workspace root."),
                "old_text": _string("The exact text to replace."),
                "new_text": _string("The replacement text."),
            },
            ["path", "old_text", "new_text"],
        ),
        kind=ToolKind.EDIT,
        timeout=HARNESS_TOOL_TIMEOUT,
    ),
    ToolSpec(
        name="glob",
        description="Find workspace files whose relative path matches a glob pattern (e.g. '**/*.md').",
        parameters=_schema({"pattern": _string("A glob pattern; '**' spans directories.")}, ["pattern"]),
        kind=ToolKind.READ,
        idempotent=True,
        timeout=HARNESS_TOOL_TIMEOUT,
    ),
    ToolSpec(
        name="grep",
        description="Search workspace files for a regular expression; returns 'path:line: text' lines (at most 500).",
        parameters=_schema(
            {
                "pattern": _string("A regular expression."),
                "dir": _string("Directory to search, relative to the workspace root; omit for everything."),
            },
            ["pattern"],
        ),
        kind=ToolKind.READ,
        idempotent=True,
        timeout=HARNESS_TOOL_TIMEOUT,
    ),
    ToolSpec(
        name="delete",
        description="Delete a workspace file or directory.",
        parameters=_schema({"path": _string("Path relative to the workspace root.")}, ["path"]),
        kind=ToolKind.DELETE,
        timeout=HARNESS_TOOL_TIMEOUT,
    ),
    ToolSpec(
        name="rename",
        description="Move or rename a workspace file or directory (the destination must not exist).",
        parameters=_schema(
            {"old_path": _string("The current path."), "new_path": _string("The new path.")}, ["old_path", "new_path"]
        ),
        kind=ToolKind.EDIT,
        timeout=HARNESS_TOOL_TIMEOUT,
    ),
)

DELEGATE_TASK = ToolSpec(
    name="delegate_task",
    description=(
        "Hand a subtask to one of your fleet's specialist agents and get its reply. "
        "Name the agent and give it a self-contained message."
    ),
    parameters=_schema(
        {
            "agent": _string("The fleet member to delegate to."),
            "message": _string("What it should do, with all the context it needs."),
        },
        ["agent", "message"],
    ),
    kind=ToolKind.EXECUTE,
    idempotent=True,
    timeout=DELEGATION_TIMEOUT + 5,
)

TASK = ToolSpec(
    name="task",
    description=(
        "Spawn an ephemeral general-purpose sub-agent to carry out one self-contained task in an isolated "
        "workspace (its own plan and files), and get its final report. It cannot ask you questions, so "
        "describe the task completely."
    ),
    parameters=_schema(
        {
            "description": _string("The complete task for the sub-agent."),
            "subagent_type": _string("The kind of sub-agent; only 'general-purpose' exists."),
        },
        ["description"],
    ),
    kind=ToolKind.EXECUTE,
    idempotent=True,
    timeout=DELEGATION_TIMEOUT + 5,
)


def unknown_arguments(spec: ToolSpec, arguments: Mapping[str, object]) -> str | None:
    """What is wrong with keys of `arguments` that `spec` does not declare, or None.

    Built-in tools refuse them as user tools do (a model's `ls({"path": ...})` must not list the
    root): `got an unknown argument 'path' (it takes: dir)`.
    """
    accepted = tuple(spec.parameters.get("properties", {}))
    unknown = [key for key in arguments if key not in accepted]
    if not unknown:
        return None
    listed = ", ".join(f"'{key}'" for key in unknown)
    noun = "an unknown argument" if len(unknown) == 1 else "unknown arguments"
    return f"got {noun} {listed} (it takes: {', '.join(accepted) or 'no arguments'})"


PLAN_TOOL_NAMES = frozenset({WRITE_TODOS.name})
FILE_TOOL_NAMES = frozenset(t.name for t in FILE_TOOLS)
MEMORY_TOOL_NAMES = PLAN_TOOL_NAMES | FILE_TOOL_NAMES
"""Tools the memory service serves (on `atmo.mem.tool.<name>`)."""

OFFLOAD_DIR = "tool-output"
OFFLOAD_PREVIEW_CHARS = 1500
_UNSAFE_TOOL_CHARS = re.compile(r"[^A-Za-z0-9_.-]")


def offload_path(tool_name: str) -> str:
    """Where an over-long result of `tool_name` is saved: `tool-output/<tool>-<8 hex>.txt`."""
    safe = _UNSAFE_TOOL_CHARS.sub("_", tool_name.strip()) or "tool"
    return f"{OFFLOAD_DIR}/{safe}-{uuid.uuid4().hex[:8]}.txt"


def offload_preview(result: str, path: str) -> str:
    """What the model sees instead of an offloaded result: its head and where the rest is."""
    hidden = len(result) - OFFLOAD_PREVIEW_CHARS
    return (
        f"{result[:OFFLOAD_PREVIEW_CHARS]}\n\n"
        f"[... {hidden} chars truncated. Full output saved to {path} — use read_file to read it.]"
    )
