"""The harness's built-in tool specs as the reference registers them, and the tool-output offload texts."""

from __future__ import annotations

import re

from atmosphere.sdk import ToolKind
from atmosphere.sdk.builtin_tools import (
    FILE_TOOL_NAMES,
    FILE_TOOLS,
    MEMORY_TOOL_NAMES,
    WRITE_TODOS,
    offload_path,
    offload_preview,
)

STATUSES = ["pending", "in_progress", "completed", "abandoned"]

# ---- write_todos


def test_write_todos_spec() -> None:
    assert WRITE_TODOS.name == "write_todos"
    assert WRITE_TODOS.kind is ToolKind.EDIT
    schema = WRITE_TODOS.parameters
    assert schema["type"] == "object"
    assert schema["required"] == ["todos"]
    assert list(schema["properties"]) == ["todos", "goal"]
    assert schema["properties"]["todos"]["type"] == "array"
    assert schema["properties"]["todos"]["description"]
    assert schema["properties"]["goal"] == {
        "type": "string",
        "description": schema["properties"]["goal"]["description"],
    }
    # Deliberately beyond the reference (which describes the item shape only in prose).
    items = schema["properties"]["todos"]["items"]
    assert items["type"] == "object"
    assert set(items["properties"]) == {"content", "status", "activeForm"}
    assert items["properties"]["status"]["enum"] == STATUSES
    assert items["required"] == ["content", "status"]


def test_write_todos_description_says_what_the_reference_says() -> None:
    description = WRITE_TODOS.description
    for phrase in ("FULL list", "replaces the previous", "'content'", "'status'", "'activeForm'", "imperative"):
        assert phrase in description
    assert "present continuous" in description
    assert "exactly one item in_progress" in description
    assert "more than one step" in description
    for status in STATUSES:
        assert status in description


# ---- file tools

EXPECTED = [
    ("ls", ToolKind.READ, ["dir"], []),
    # `offset` is ours: a file larger than one bus message is read in pages (the reply says where
    # to go on), and since unknown arguments are refused, the schema must declare it.
    ("read_file", ToolKind.READ, ["path", "offset"], ["path"]),
    ("write_file", ToolKind.EDIT, ["path", "content"], ["path", "content"]),
    ("edit_file", ToolKind.EDIT, ["path", "old_text", "new_text"], ["path", "old_text", "new_text"]),
    ("glob", ToolKind.READ, ["pattern"], ["pattern"]),
    ("grep", ToolKind.READ, ["pattern", "dir"], ["pattern"]),
    ("delete", ToolKind.DELETE, ["path"], ["path"]),
    ("rename", ToolKind.EDIT, ["old_path", "new_path"], ["old_path", "new_path"]),
]


def test_file_specs_match_the_reference() -> None:
    actual = [
        (spec.name, spec.kind, list(spec.parameters["properties"]), spec.parameters["required"]) for spec in FILE_TOOLS
    ]
    assert actual == EXPECTED
    assert frozenset(name for name, *_ in EXPECTED) == FILE_TOOL_NAMES
    for spec in FILE_TOOLS:
        assert spec.parameters["type"] == "object"
        assert set(spec.parameters) == {"type", "properties", "required"}
        for name, schema in spec.parameters["properties"].items():
            assert schema["type"] == ("integer" if name == "offset" else "string")
            assert schema["description"]
        assert len(spec.description) > 30


def test_memory_serves_the_plan_and_file_tools() -> None:
    assert FILE_TOOL_NAMES | {WRITE_TODOS.name} == MEMORY_TOOL_NAMES


# ---- tool-output offload


def test_offload_path() -> None:
    assert re.fullmatch(r"tool-output/web_search-[0-9a-f]{8}\.txt", offload_path("web_search"))
    assert re.fullmatch(r"tool-output/a_b_c.d-e-[0-9a-f]{8}\.txt", offload_path("a b/c.d-e"))
    assert re.fullmatch(r"tool-output/tool-[0-9a-f]{8}\.txt", offload_path("  "))
    assert re.fullmatch(r"tool-output/\.\.-[0-9a-f]{8}\.txt", offload_path(".."))
    path = offload_path("../../x")
    assert path.startswith("tool-output/.._.._x-")
    # A literal, safe name: one file under tool-output/, no `.`/`..` segment.
    assert len(path.split("/")) == 2
    assert all(segment not in {"", ".", ".."} for segment in path.split("/"))
    assert offload_path("t") != offload_path("t")


def test_offload_preview() -> None:
    result = "x" * 1500 + "y" * 700
    preview = offload_preview(result, "tool-output/t-1234abcd.txt")
    assert preview == (
        "x" * 1500
        + "\n\n[... 700 chars truncated. Full output saved to tool-output/t-1234abcd.txt — use read_file to read it.]"
    )
