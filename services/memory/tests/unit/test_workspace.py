"""The bounded workspace store: path validation, every operation, every bound, grep/glob."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from atmosphere.memory.vfs.filestore import Limits, WorkspaceFileSystem
from atmosphere.memory.vfs.filesystem import Entry, Hit, WorkspaceError
from atmosphere.memory.vfs.paths import MAX_PATH_DEPTH, validate_path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def fs(root: Path) -> WorkspaceFileSystem:
    return WorkspaceFileSystem(root)


def error_of(call: object, *args: object) -> str:
    assert callable(call)
    with pytest.raises(WorkspaceError) as info:
        call(*args)
    return str(info.value)


# ---- validate_path


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("a", "a"),
        ("notes/todo.md", "notes/todo.md"),
        ("notes/", "notes"),  # trailing slashes drop, as Java's split does
        ("ｆｉｌｅ.txt", "file.txt"),  # NFKC before anything else
        ("e\u0301.txt", "\u00e9.txt"),  # composed
        ("..%2fx", "..%2fx"),  # never URL-decoded: a literal name
        ("...", "..."),
        (" ..", " .."),
        ("-rf", "-rf"),
        ("ab:c", "ab:c"),  # a colon is only refused as a drive letter (`c:x`)
    ],
)
def test_validate_path_accepts_and_normalizes(path: str, expected: str) -> None:
    assert validate_path(path) == expected


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("", "path must not be blank"),
        ("   ", "path must not be blank"),
        ("a\\b", "path must use forward slashes"),
        ("/etc/passwd", "path must be relative"),
        ("c:x", "path must be relative"),
        ("C:/Windows", "path must be relative"),
        ("a//b", "path contains an illegal segment (''): a//b"),
        ("a/./b", "path contains an illegal segment ('.'): a/./b"),
        (" /x", "path contains an illegal segment (' '):  /x"),
        ("a/\u3000/b", "path contains an illegal segment (' '): a/\\u3000/b"),  # NFKC'd segment, escaped echo
        ("../x", "path contains an illegal segment ('..'): ../x"),
        (".", "path contains an illegal segment ('.'): ."),
        ("．．／x", "path contains an illegal segment ('..'): ．．／x"),
        ("\u2025/x", "path contains an illegal segment ('..'): \u2025/x"),
        ("a\x00b", "path contains a control character (U+0000): a\\x00b"),
        ("a\nb", "path contains a control character (U+000A): a\\nb"),
        ("\u202eevil", "path contains a control character (U+202E): \\u202eevil"),
        ("＼x", "path must use forward slashes"),
    ],
)
def test_validate_path_rejects(path: str, message: str) -> None:
    assert error_of(validate_path, path) == message


def test_validate_path_lengths() -> None:
    assert validate_path("a" * 255) == "a" * 255
    assert error_of(validate_path, "a" * 256).startswith("path segment is too long: 256 bytes (limit 255)")
    assert error_of(validate_path, "é" * 128).startswith("path segment is too long: 256 bytes")  # bytes, not chars
    long_path = "/".join(["a" * 200] * 21)
    assert error_of(validate_path, long_path) == f"path is too long: {len(long_path)} bytes (limit 4096)"
    deep = "/".join(["d"] * (MAX_PATH_DEPTH + 1))
    assert error_of(validate_path, deep) == f"path is too deep: {MAX_PATH_DEPTH + 1} segments (limit {MAX_PATH_DEPTH})"
    assert validate_path("/".join(["d"] * MAX_PATH_DEPTH)).count("/") == MAX_PATH_DEPTH - 1


# ---- read / write


def test_write_read_round_trip_and_lazy_root(fs: WorkspaceFileSystem, root: Path) -> None:
    assert fs.ls() == []
    assert error_of(fs.read, "a.txt") == "File not found: a.txt"
    assert not root.exists(), "reads must not create the store"
    fs.write("notes/todo.md", "héllo\nwörld")
    assert fs.read("notes/todo.md") == "héllo\nwörld"
    assert (root / "notes" / "todo.md").read_bytes() == "héllo\nwörld".encode()
    fs.write("notes/todo.md", "")
    assert fs.read("notes/todo.md") == ""
    assert error_of(fs.read, "missing/x") == "File not found: missing/x"
    assert error_of(fs.read, "notes") == "Is a directory: notes"
    assert error_of(fs.read, "notes/todo.md/x") == "Not a directory: notes/todo.md"
    assert [name for name in os.listdir(root / "notes") if name.endswith(".tmp")] == []


def test_read_refuses_oversize_and_non_utf8(root: Path) -> None:
    fs = WorkspaceFileSystem(root, Limits(max_file_bytes=10))
    root.mkdir()
    (root / "big.txt").write_bytes(b"x" * 11)
    (root / "ok.txt").write_bytes(b"x" * 10)
    (root / "bin.dat").write_bytes(b"\xff\xfe")
    assert error_of(fs.read, "big.txt") == "File too large to read: big.txt is 11 bytes (limit 10)"
    assert fs.read("ok.txt") == "x" * 10
    assert error_of(fs.read, "bin.dat") == "File is not UTF-8 text: bin.dat"


def test_write_rejects_unpaired_surrogates(fs: WorkspaceFileSystem) -> None:
    assert "unpaired surrogate" in error_of(fs.write, "a.txt", "\ud800")


# ---- bounds


def test_per_file_limit(root: Path) -> None:
    fs = WorkspaceFileSystem(root, Limits(max_file_bytes=10))
    fs.write("a.txt", "x" * 10)
    assert (
        error_of(fs.write, "a.txt", "x" * 11)
        == "Write rejected: a.txt would be 11 bytes, over the 10-byte per-file limit"
    )
    # bytes, not characters
    assert (
        error_of(fs.write, "b.txt", "é" * 6)
        == "Write rejected: b.txt would be 12 bytes, over the 10-byte per-file limit"
    )
    assert fs.read("a.txt") == "x" * 10
    assert fs.usage() == (1, 10)


def test_file_count_limit_applies_to_new_paths_only(root: Path) -> None:
    fs = WorkspaceFileSystem(root, Limits(max_files=2))
    fs.write("a", "1")
    fs.write("d/b", "2")
    assert error_of(fs.write, "c", "3") == "Write rejected: the store already holds 2 files, at the 2-file limit"
    assert not (root / "c").exists()
    fs.write("a", "overwrite is fine")
    fs.delete("a")
    fs.write("c", "3")
    assert fs.usage() == (2, 2)


def test_total_limit_is_projected(root: Path) -> None:
    fs = WorkspaceFileSystem(root, Limits(max_total_bytes=10))
    fs.write("a", "x" * 6)
    fs.write("b", "x" * 4)
    fs.write("a", "y" * 6)  # 10 - 6 + 6
    assert (
        error_of(fs.write, "c", "z")
        == "Write rejected: c would bring the store to 11 bytes, over the 10-byte total limit"
    )
    assert (
        error_of(fs.write, "a", "y" * 7)
        == "Write rejected: a would bring the store to 11 bytes, over the 10-byte total limit"
    )
    fs.write("a", "y")
    fs.write("c", "z" * 5)
    assert fs.usage() == (3, 10)


def test_rejected_write_leaves_no_directories(root: Path) -> None:
    fs = WorkspaceFileSystem(root, Limits(max_files=1))
    fs.write("a", "1")
    error_of(fs.write, "deep/er/b", "2")
    assert sorted(os.listdir(root)) == ["a"]


def test_directory_limit(root: Path) -> None:
    fs = WorkspaceFileSystem(root, Limits(max_dirs=2))
    fs.write("a/b/c.txt", "x")
    assert (
        error_of(fs.write, "d/x", "y")
        == "Write rejected: the store already holds 2 directories, at the 2-directory limit"
    )
    fs.delete("a")
    fs.write("d/x", "y")


def test_accounting_is_computed_from_disk_and_shared_per_root(root: Path) -> None:
    (root / "sub").mkdir(parents=True)
    (root / "a").write_text("12345")
    (root / "sub" / "b").write_text("123")
    os.symlink("/etc/passwd", root / "link")  # links are not counted
    first = WorkspaceFileSystem(root, Limits(max_files=3))
    second = WorkspaceFileSystem(root / ".." / "store", Limits(max_files=3))  # another spelling, same root
    assert first.usage() == (2, 8)
    first.write("c", "1")
    assert second.usage() == (3, 9)
    assert error_of(second.write, "d", "1").startswith("Write rejected: the store already holds 3 files")


def test_concurrent_writers_respect_the_count(root: Path) -> None:
    limit = 40
    stores = [WorkspaceFileSystem(root, Limits(max_files=limit)) for _ in range(4)]
    accepted: list[str] = []
    guard = threading.Lock()

    def writer(index: int) -> None:
        fs = stores[index % len(stores)]
        for n in range(20):
            path = f"w{index}/f{n}"
            try:
                fs.write(path, "x" * 3)
            except WorkspaceError:
                continue
            with guard:
                accepted.append(path)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    on_disk = [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()]
    assert len(accepted) == limit
    assert sorted(on_disk) == sorted(accepted)
    assert stores[0].usage() == (limit, 3 * limit)


# ---- edit


def test_edit(fs: WorkspaceFileSystem) -> None:
    fs.write("a.txt", "one two three")
    fs.edit("a.txt", "two", "2")
    assert fs.read("a.txt") == "one 2 three"
    fs.edit("a.txt", " 2", "")
    assert fs.read("a.txt") == "one three"
    assert error_of(fs.edit, "a.txt", "", "x") == "oldText must not be empty"
    assert error_of(fs.edit, "a.txt", "four", "4") == "oldText not found in a.txt — nothing was changed"
    fs.write("b.txt", "x x x")
    message = "oldText matches 3 times in b.txt — it must match exactly once; include more surrounding context"
    assert error_of(fs.edit, "b.txt", "x", "y") == message
    fs.write("c.txt", "aaa")
    assert error_of(fs.edit, "c.txt", "aa", "b").startswith("oldText matches 2 times in c.txt")  # overlaps count
    assert error_of(fs.edit, "nope.txt", "a", "b") == "File not found: nope.txt"
    assert fs.read("b.txt") == "x x x"


def test_edit_rechecks_bounds(root: Path) -> None:
    fs = WorkspaceFileSystem(root, Limits(max_file_bytes=10, max_total_bytes=12))
    fs.write("a", "abc")
    assert (
        error_of(fs.edit, "a", "b", "b" * 9) == "Write rejected: a would be 11 bytes, over the 10-byte per-file limit"
    )
    fs.write("b", "x" * 8)
    fs.edit("a", "c", "cc")  # 12 bytes in all: at the limit is fine
    message = "Write rejected: a would bring the store to 13 bytes, over the 12-byte total limit"
    assert error_of(fs.edit, "a", "cc", "ccc") == message
    assert fs.read("a") == "abcc"


# ---- delete / rename


def test_delete_files_and_trees(fs: WorkspaceFileSystem, root: Path) -> None:
    fs.write("keep.txt", "k")
    fs.write("tree/a.txt", "aa")
    fs.write("tree/sub/b.txt", "bbb")
    fs.delete("tree")
    assert sorted(os.listdir(root)) == ["keep.txt"]
    assert fs.usage() == (1, 1)
    assert error_of(fs.delete, "tree") == "Not found: tree"
    assert error_of(fs.delete, "x/y") == "Not found: x/y"
    fs.delete("keep.txt")
    assert fs.usage() == (0, 0)


def test_rename(fs: WorkspaceFileSystem, root: Path) -> None:
    fs.write("a.txt", "A")
    fs.write("b.txt", "B")
    fs.rename("a.txt", "moved/deeper/a.txt")  # parents created
    assert fs.read("moved/deeper/a.txt") == "A"
    assert not (root / "a.txt").exists()
    message = "Destination already exists: b.txt — delete it first if you want to replace it"
    assert error_of(fs.rename, "moved/deeper/a.txt", "b.txt") == message
    assert error_of(fs.rename, "b.txt", "b.txt").startswith("Destination already exists: b.txt")
    assert error_of(fs.rename, "moved", "moved/inner") == "Cannot move moved into itself (moved/inner)"
    assert error_of(fs.rename, "moved", "moved") == "Cannot move moved into itself (moved)"
    assert error_of(fs.rename, "ghost", "x") == "Not found: ghost"
    fs.rename("moved", "renamed")
    assert fs.read("renamed/deeper/a.txt") == "A"
    fs.rename("renamed", "movedx")  # a sibling sharing the prefix is not "into itself"
    assert fs.usage() == (2, 2)


def test_rename_keeps_paths_within_depth(fs: WorkspaceFileSystem) -> None:
    fs.write("/".join(["d"] * 40) + "/f", "x")
    message = error_of(fs.rename, "d", "/".join(["e"] * 30))
    assert message == f"Rename rejected: {'/'.join(['e'] * 30)} would nest the tree 70 levels deep (limit 64)"


# ---- ls


def test_ls_orders_directories_first(fs: WorkspaceFileSystem, root: Path) -> None:
    fs.write("b.txt", "bb")
    fs.write("a.txt", "a")
    fs.write("z/x.md", "x")
    fs.write("c/y.md", "yy")
    assert fs.ls() == [
        Entry("c", 0, directory=True),
        Entry("z", 0, directory=True),
        Entry("a.txt", 1, directory=False),
        Entry("b.txt", 2, directory=False),
    ]
    assert fs.ls(".") == fs.ls(None) == fs.ls("")
    assert fs.ls("c") == [Entry("c/y.md", 2, directory=False)]
    assert fs.ls("nope") == []
    assert fs.ls("nope/deeper") == []
    assert error_of(fs.ls, "a.txt") == "Not a directory: a.txt"
    os.symlink(root / "c", root / "link")
    os.mkfifo(root / "pipe")
    assert [entry.path for entry in fs.ls()] == ["c", "z", "a.txt", "b.txt"]  # links/FIFOs hidden


# ---- glob


@pytest.fixture
def tree(fs: WorkspaceFileSystem) -> WorkspaceFileSystem:
    for path in ["a.md", "b.txt", "c.md", "docs/x.md", "docs/y.txt", "docs/deep/z.md", "ab.txt", "{q}.txt"]:
        fs.write(path, path)
    return fs


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("*.md", ["a.md", "c.md"]),
        ("**/*.md", ["a.md", "c.md", "docs/deep/z.md", "docs/x.md"]),
        ("docs/*", ["docs/x.md", "docs/y.txt"]),
        ("docs/**", ["docs/deep/z.md", "docs/x.md", "docs/y.txt"]),
        ("?.txt", ["b.txt"]),
        ("[ab].*", ["a.md", "b.txt"]),
        ("[!a].md", ["c.md"]),
        ("{a,c}.md", ["a.md", "c.md"]),
        ("\\{q}.txt", ["{q}.txt"]),
        ("docs", []),  # files only
        ("nothing*", []),
        ("ｄｏｃｓ/*.md", ["docs/x.md"]),
    ],
)
def test_glob(tree: WorkspaceFileSystem, pattern: str, expected: list[str]) -> None:
    assert tree.glob(pattern) == expected


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("", "pattern must not be blank"),
        ("  ", "pattern must not be blank"),
        ("[abc", "Invalid glob pattern: unclosed character class: [abc"),
        ("{a,{b}}", "Invalid glob pattern: cannot nest groups: {a,{b}}"),
        ("{a,b", "Invalid glob pattern: missing '}': {a,b"),
        ("a\\", "Invalid glob pattern: no character to escape: a\\"),
        ("[z-a]", "Invalid glob pattern: "),
        ("x" * 513, "Pattern too long: 513 chars (limit 512)"),
    ],
)
def test_glob_errors(tree: WorkspaceFileSystem, pattern: str, message: str) -> None:
    assert error_of(tree.glob, pattern).startswith(message)


# ---- grep


def test_grep_hits_in_sorted_file_order(tree: WorkspaceFileSystem) -> None:
    tree.write("docs/deep/z.md", "alpha\nbeta\r\ngamma alpha")
    tree.write("a.md", "alpha first")
    assert tree.grep("alpha") == [
        Hit("a.md", 1, "alpha first"),
        Hit("docs/deep/z.md", 1, "alpha"),
        Hit("docs/deep/z.md", 3, "gamma alpha"),
    ]
    assert tree.grep("^alpha$", "docs") == [Hit("docs/deep/z.md", 1, "alpha")]
    assert tree.grep("alpha", "a.md") == [Hit("a.md", 1, "alpha first")]  # a file scope searches that file
    assert tree.grep("alpha", "missing") == []
    assert tree.grep("b[e]ta") == [Hit("docs/deep/z.md", 2, "beta")]


def test_grep_skips_binary_links_and_hardlinks(fs: WorkspaceFileSystem, root: Path, tmp_path: Path) -> None:
    fs.write("text.txt", "needle")
    (root / "bin.dat").write_bytes(b"needle\x00")
    (root / "latin1.txt").write_bytes(b"needle \xe9")
    outside = tmp_path / "outside.txt"
    outside.write_text("needle outside")
    os.symlink(outside, root / "link.txt")
    os.link(outside, root / "hard.txt")
    assert fs.grep("needle") == [Hit("text.txt", 1, "needle")]


def test_grep_bounds(root: Path) -> None:
    fs = WorkspaceFileSystem(root, Limits(max_grep_hits=3, grep_line_chars=5))
    fs.write("a.txt", "x1\nx2\n")
    fs.write("b.txt", "x3\nx4\nx5")
    assert [hit.text for hit in fs.grep("x")] == ["x1", "x2", "x3"]
    fs.write("c.txt", "long-line-here")
    assert fs.grep("long") == [Hit("c.txt", 1, "long-…")]
    assert error_of(fs.grep, "a" * 513) == "Pattern too long: 513 chars (limit 512)"
    assert error_of(fs.grep, "(unclosed").startswith("Invalid regex pattern: ")
    assert error_of(fs.grep, "").startswith("pattern must not be blank")


def test_grep_line_truncation_default(fs: WorkspaceFileSystem) -> None:
    fs.write("a.txt", "q" * 600)
    (hit,) = fs.grep("q")
    assert hit.text == "q" * 500 + "…"


CATASTROPHIC = "(a|aa)+$"  # the `regex` module optimizes `(a+)+$`; this one still backtracks exponentially


def test_grep_deadline_reference_message(fs: WorkspaceFileSystem) -> None:
    fs.write("a.txt", "a" * 40 + "b")
    started = time.monotonic()
    message = error_of(fs.grep, CATASTROPHIC)
    elapsed = time.monotonic() - started
    assert message == (
        "grep timed out on pattern '(a|aa)+$' — simplify the pattern "
        "(catastrophic backtracking is cut off after 2000 ms)"
    )
    # Cut off, not finished: uncut, this pattern on 41 characters backtracks for hours. The bound
    # is loose because the engine checks its clock periodically and a loaded machine (parallel
    # test workers) can starve its thread for seconds.
    assert 1.9 <= elapsed < 30


def test_grep_deadline_covers_the_whole_search(root: Path) -> None:
    fs = WorkspaceFileSystem(root, Limits(grep_deadline=0.3))
    # Each line alone is fast (~10 ms) but together they are far over the deadline.
    for n in range(20):
        fs.write(f"f{n:02}.txt", "\n".join(["a" * 22 + "b"] * 10))
    started = time.monotonic()
    message = error_of(fs.grep, CATASTROPHIC)
    # The timeout itself shows the deadline spans the search (no line alone reaches it); the wall
    # bound is loose for a loaded machine.
    assert time.monotonic() - started < 10
    assert message.endswith("(catastrophic backtracking is cut off after 300 ms)")


def test_glob_deadline(root: Path) -> None:
    fs = WorkspaceFileSystem(root, Limits(grep_deadline=0.05))
    for n in range(30):  # each name takes the pattern ~40 ms to reject; the deadline spans all of them
        fs.write(f"b{'a' * 200}{n}", "x")
    started = time.monotonic()
    message = error_of(fs.glob, "*a" * 16 + "*b")
    assert time.monotonic() - started < 10  # loose for a loaded machine: the timeout itself is the proof
    assert message == (
        f"glob timed out on pattern '{'*a' * 16}*b' — simplify the pattern "
        "(catastrophic backtracking is cut off after 50 ms)"
    )
