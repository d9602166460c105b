"""The eight file tools: the exact texts the model sees (their specs are the SDK's, tested there)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from atmosphere.memory.vfs.file_tools import UNAVAILABLE, run_file_tool
from atmosphere.memory.vfs.filestore import Limits, WorkspaceFileSystem
from atmosphere.memory.vfs.filesystem import Entry, Hit
from atmosphere.sdk.builtin_tools import FILE_TOOLS
from atmosphere.sdk.runtime import ToolSpec


@pytest.fixture
def fs(tmp_path: Path) -> WorkspaceFileSystem:
    return WorkspaceFileSystem(tmp_path / "store")


# ---- success texts


def test_tool_texts(fs: WorkspaceFileSystem) -> None:
    def run(name: str, **arguments: object) -> str:
        return run_file_tool(fs, name, arguments)

    assert run("ls") == "(empty)"
    assert run("write_file", path="notes/todo.md", content="- buy milk\n- call bob") == "Wrote notes/todo.md"
    assert run("write_file", path="a.txt", content="abc") == "Wrote a.txt"
    assert run("ls") == "notes/\na.txt (3 bytes)"
    assert run("ls", dir=".") == run("ls", dir="") == run("ls", dir=None) == run("ls")
    assert run("ls", dir="notes") == "notes/todo.md (21 bytes)"
    assert run("read_file", path="notes/todo.md") == "- buy milk\n- call bob"
    assert run("edit_file", path="notes/todo.md", old_text="milk", new_text="bread") == "Edited notes/todo.md"
    assert run("glob", pattern="**/*.md") == "notes/todo.md"
    assert run("glob", pattern="*.md") == "(no matches)"
    assert run("grep", pattern="b(read|ob)") == "notes/todo.md:1: - buy bread\nnotes/todo.md:2: - call bob"
    assert run("grep", pattern="bob", dir="notes") == "notes/todo.md:2: - call bob"
    assert run("grep", pattern="zzz") == "(no matches)"
    assert run("rename", old_path="a.txt", new_path="b/a.txt") == "Renamed a.txt to b/a.txt"
    assert run("delete", path="b") == "Deleted b"
    assert run("delete", path="b") == "Error: Not found: b"
    assert run("read_file", path="missing.md") == "Error: File not found: missing.md"


def test_content_and_new_text_default_to_empty(fs: WorkspaceFileSystem) -> None:
    assert run_file_tool(fs, "write_file", {"path": "a"}) == "Wrote a"
    assert run_file_tool(fs, "write_file", {"path": "b", "content": None}) == "Wrote b"
    assert fs.read("a") == fs.read("b") == ""
    fs.write("c", "keep drop")
    assert run_file_tool(fs, "edit_file", {"path": "c", "old_text": " drop", "new_text": None}) == "Edited c"
    assert run_file_tool(fs, "edit_file", {"path": "c", "old_text": "keep"}) == "Edited c"
    assert fs.read("c") == ""
    fs.write("d", "a  b")
    assert (
        run_file_tool(fs, "edit_file", {"path": "d", "old_text": "  ", "new_text": " "}) == "Edited d"
    )  # whitespace is text


REQUIRED = [
    (spec.name, name)
    for spec in FILE_TOOLS
    for name in spec.parameters["required"]
    if name not in {"content", "new_text"}
]


@pytest.mark.parametrize(("tool", "missing"), REQUIRED)
@pytest.mark.parametrize("value", ["absent", None, "", "   "])
def test_required_arguments(fs: WorkspaceFileSystem, tool: str, missing: str, value: str | None) -> None:
    arguments: dict[str, object] = {"path": "a", "old_text": "x", "new_text": "y", "pattern": "x"}
    arguments |= {"old_path": "a", "new_path": "b", "content": "c"}
    accepted = next(spec.parameters["properties"] for spec in FILE_TOOLS if spec.name == tool)
    arguments = {key: value for key, value in arguments.items() if key in accepted}  # only its own
    if value == "absent":
        del arguments[missing]
    else:
        arguments[missing] = value
    result = run_file_tool(fs, tool, arguments)
    if missing == "old_text" and value == "":
        assert result == "Error: oldText must not be empty"  # the store's own message
    elif missing == "old_text" and value == "   ":
        assert result == "Error: File not found: a"  # whitespace is text to find, not a missing argument
    else:
        assert result == f"Error: '{missing}' is required"


def test_unavailable_and_unknown() -> None:
    for spec in FILE_TOOLS:
        assert run_file_tool(None, spec.name, {"path": "a"}) == UNAVAILABLE
    assert UNAVAILABLE == "File tools unavailable: no agent filesystem is bound to this session."
    assert run_file_tool(None, "format_disk", {}) == "Error: unknown file tool 'format_disk'"


def test_non_string_arguments(fs: WorkspaceFileSystem) -> None:
    assert run_file_tool(fs, "write_file", {"path": 2024, "content": 1.5}) == "Wrote 2024"
    assert fs.read("2024") == "1.5"
    assert run_file_tool(fs, "read_file", {"path": ["a"]}) == "Error: 'path' must be a string"
    assert run_file_tool(fs, "read_file", {"path": True}) == "Error: 'path' must be a string"
    assert run_file_tool(fs, "write_file", {"path": "x", "content": {"a": 1}}) == "Error: 'content' must be a string"
    assert run_file_tool(fs, "ls", {"dir": 3}) == "(empty)"


def test_edit_messages_through_the_tool(fs: WorkspaceFileSystem) -> None:
    fs.write("a", "x x")
    assert (
        run_file_tool(fs, "edit_file", {"path": "a", "old_text": "", "new_text": "y"})
        == "Error: oldText must not be empty"
    )
    assert run_file_tool(fs, "edit_file", {"path": "a", "new_text": "y"}) == "Error: 'old_text' is required"
    assert run_file_tool(fs, "edit_file", {"path": "a", "old_text": "x", "new_text": "y"}) == (
        "Error: oldText matches 2 times in a — it must match exactly once; include more surrounding context"
    )


def test_bounds_through_the_tool(tmp_path: Path) -> None:
    fs = WorkspaceFileSystem(tmp_path / "s", Limits(max_file_bytes=4, max_files=1))
    assert run_file_tool(fs, "write_file", {"path": "a", "content": "12345"}) == (
        "Error: Write rejected: a would be 5 bytes, over the 4-byte per-file limit"
    )
    assert run_file_tool(fs, "write_file", {"path": "a", "content": "1"}) == "Wrote a"
    assert run_file_tool(fs, "write_file", {"path": "b", "content": "1"}) == (
        "Error: Write rejected: the store already holds 1 files, at the 1-file limit"
    )
    assert run_file_tool(fs, "glob", {"pattern": "[x"}).startswith("Error: Invalid glob pattern: ")
    assert run_file_tool(fs, "grep", {"pattern": "(x"}).startswith("Error: Invalid regex pattern: ")


def test_validation_errors_through_the_tool(fs: WorkspaceFileSystem) -> None:
    assert run_file_tool(fs, "read_file", {"path": "../etc/passwd"}) == (
        "Error: path contains an illegal segment ('..'): ../etc/passwd"
    )
    assert run_file_tool(fs, "write_file", {"path": "/etc/x", "content": ""}) == "Error: path must be relative"
    assert run_file_tool(fs, "ls", {"dir": "a\\b"}) == "Error: path must use forward slashes"


class ExplodingFileSystem:
    """A store whose every call fails the way an unexpected OS error or a bug would."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def ls(self, directory: str | None = None) -> list[Entry]:
        raise self.error

    def read(self, path: str) -> str:
        raise self.error

    def write(self, path: str, content: str) -> None:
        raise self.error

    def edit(self, path: str, old_text: str, new_text: str) -> None:
        raise self.error

    def glob(self, pattern: str) -> list[str]:
        raise self.error

    def grep(self, pattern: str, directory: str | None = None) -> list[Hit]:
        raise self.error

    def delete(self, path: str) -> None:
        raise self.error

    def rename(self, old_path: str, new_path: str) -> None:
        raise self.error

    def usage(self) -> tuple[int, int]:
        raise self.error


def test_unexpected_errors_never_escape_and_never_leak_paths(caplog: pytest.LogCaptureFixture) -> None:
    denied = ExplodingFileSystem(PermissionError(13, "Permission denied", "/srv/secret/owner/files/x"))
    assert run_file_tool(denied, "read_file", {"path": "x"}) == "Error: Permission denied"
    bug = ExplodingFileSystem(RuntimeError("/srv/secret internal detail"))
    with caplog.at_level(logging.ERROR):
        assert run_file_tool(bug, "ls", {}) == "Error: ls failed unexpectedly"
    assert "failed unexpectedly" in caplog.text


# ---- arguments a tool does not take (issue 9: `ls({"path": ...})` listed the root)


def test_an_unknown_argument_is_an_error_naming_it(fs: WorkspaceFileSystem) -> None:
    fs.write("notes/a.md", "x")
    assert run_file_tool(fs, "ls", {"path": "notes"}) == "Error: ls got an unknown argument 'path' (it takes: dir)"
    assert run_file_tool(fs, "ls", {"dir": "notes"}) == "notes/a.md (1 bytes)"


VALID = {
    "ls": {},
    "read_file": {"path": "a.md"},
    "write_file": {"path": "a.md", "content": "x"},
    "edit_file": {"path": "a.md", "old_text": "x", "new_text": "y"},
    "glob": {"pattern": "*.md"},
    "grep": {"pattern": "x"},
    "delete": {"path": "a.md"},
    "rename": {"old_path": "a.md", "new_path": "b.md"},
}


@pytest.mark.parametrize("spec", FILE_TOOLS, ids=lambda spec: spec.name)
def test_every_file_tool_refuses_unknown_arguments_before_acting(fs: WorkspaceFileSystem, spec: ToolSpec) -> None:
    name = spec.name
    fs.write("a.md", "x")
    accepted = ", ".join(spec.parameters["properties"])
    result = run_file_tool(fs, name, {**VALID[name], "filename": "a.md", "recursive": True})
    assert result == f"Error: {name} got unknown arguments 'filename', 'recursive' (it takes: {accepted})"
    assert fs.read("a.md") == "x"  # nothing was written, edited, deleted or moved


def test_every_tool_has_a_valid_call_in_this_test() -> None:
    # VALID must cover every tool, or the test above would skip one with a KeyError.
    assert set(VALID) == {spec.name for spec in FILE_TOOLS}


@pytest.mark.parametrize("value", [True, ["a.md"], {"p": "a.md"}])
def test_a_wrong_type_is_an_error_naming_the_argument(fs: WorkspaceFileSystem, value: object) -> None:
    assert run_file_tool(fs, "read_file", {"path": value}) == "Error: 'path' must be a string"
    assert run_file_tool(fs, "ls", {"dir": value}) == "Error: 'dir' must be a string"


def test_read_file_takes_the_offset_its_schema_declares(fs: WorkspaceFileSystem) -> None:
    fs.write("a.md", "abcdef")
    assert run_file_tool(fs, "read_file", {"path": "a.md", "offset": 2}) == "cdef"
    assert run_file_tool(fs, "read_file", {"path": "a.md", "offset": "x"}) == (
        "Error: 'offset' must be a non-negative whole number of characters"
    )
