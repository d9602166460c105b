"""Path traversal and workspace isolation (reliability targets §5: P1 hostile table, P3 race, P4 property).

Every hostile path is run through every file tool. Each answer must be `Error: ...` (or, for names that
are merely odd, stay confined to the store), never show outside content, and leave everything outside
the store byte-for-byte unchanged.

Mutating tools are never pointed at the real `/etc`: a planted `etc -> fake_etc` stands in for it, so a
broken implementation damages only the test's own tree. The real `/etc` and `/dev/zero` links are used
with the read-only tools.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atmosphere.memory.vfs.composite import CompositeFileSystem
from atmosphere.memory.vfs.file_tools import run_file_tool
from atmosphere.memory.vfs.filestore import Limits, WorkspaceFileSystem
from atmosphere.memory.vfs.filesystem import FileSystem, WorkspaceError
from atmosphere.memory.vfs.paths import validate_path
from atmosphere.memory.vfs.storeroot import StoreRoot

CANARY = "CANARY-SECRET-4f1c9"
PWNED = "pwned"
ROOMY = Limits(max_files=100_000, max_dirs=100_000, max_total_bytes=1 << 30)


# ---- the planted store


def plant(tmp: Path) -> Path:
    """A store full of traps next to an outside tree holding canaries."""
    store = tmp / "store"
    store.mkdir()
    (store / "seed.txt").write_text("seed")
    outside = tmp / "outside"
    outside.mkdir()
    (outside / "canary.txt").write_text(CANARY)
    fake_etc = tmp / "fake_etc"
    fake_etc.mkdir()
    (fake_etc / "passwd").write_text(f"root:x:0:0:{CANARY}")
    evil = tmp / "store_evil"  # shares the store's name as a string prefix
    evil.mkdir()
    (evil / "x").write_text(CANARY)
    os.symlink(fake_etc, store / "etc")
    os.symlink("/etc", store / "realetc")
    os.symlink("..", store / "up")
    for index in range(40):  # a 40-link chain ending outside
        target = outside if index == 39 else store / f"loop{index + 1}"
        os.symlink(target, store / f"loop{index}")
    os.symlink("self", store / "self")
    os.symlink(outside / "new.txt", store / "dangling")
    os.symlink(outside / "newdir", store / "dangdir")
    os.link(outside / "canary.txt", store / "hard.txt")
    os.symlink("/dev/zero", store / "zero")
    os.mkfifo(store / "fifo")
    with contextlib.suppress(OSError):  # not permitted here: that one case is skipped
        os.mknod(store / "chardev", stat.S_IFCHR | 0o600, os.makedev(1, 5))  # the /dev/zero device
    (store / "sub").mkdir()
    os.symlink(outside / "canary.txt", store / "sub" / "flink")
    os.symlink(evil, store / "evil_link")
    os.symlink("../store_evil", store / "evil_rel")
    return store


def snapshot(base: Path, skip: Path) -> dict[str, tuple[str, object]]:
    """Everything under `base` except the `skip` subtree: type plus content / link target."""
    seen: dict[str, tuple[str, object]] = {}
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        here = Path(dirpath)
        dirnames[:] = [name for name in dirnames if here / name != skip]
        for name in dirnames + filenames:
            path = here / name
            if path == skip:
                continue
            info = os.lstat(path)
            rel = str(path.relative_to(base))
            if stat.S_ISLNK(info.st_mode):
                seen[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                seen[rel] = ("dir", None)
            elif stat.S_ISREG(info.st_mode):
                seen[rel] = ("file", path.read_bytes())
            else:
                seen[rel] = ("special", stat.S_IFMT(info.st_mode))
    return seen


def links_in(store: Path) -> dict[str, str]:
    return {
        str(Path(dirpath, name).relative_to(store)): os.readlink(Path(dirpath, name))
        for dirpath, dirnames, filenames in os.walk(store, followlinks=False)
        for name in dirnames + filenames
        if Path(dirpath, name).is_symlink()
    }


# ---- P1: the hostile table

ALL = frozenset({"ls", "read", "write", "edit", "grep", "rename_from", "rename_to", "delete"})
CONTENT_OPS = frozenset({"ls", "read", "write", "edit"})
READ_ONLY = frozenset({"ls", "read", "grep", "glob"})


@dataclass(frozen=True)
class Case:
    """One hostile path; `errors` lists the operations that must answer `Error:`."""

    id: str
    path: str | Callable[[Path], str]
    errors: frozenset[str] = ALL
    read_only: bool = False
    confined: bool = False  # an odd but legal name: the write must land inside the store


def confined(case_id: str, path: str) -> Case:
    return Case(case_id, path, errors=frozenset(), confined=True)


CASES = [
    # plain traversal
    Case("dotdot", "../x"),
    Case("nested-dotdot", "a/../../x"),
    Case("dot-dotdot", "./../x"),
    Case("four-dots-double-slash", "....//x"),
    Case("backslash-dotdot", "..\\x"),
    Case("backslash-nested", "a\\..\\..\\x"),
    Case("bare-dotdot", ".."),
    # `ls`/`grep` read `.`, "" and blanks as "the root" (the reference's `dir` semantics): confined there
    Case("bare-dot", ".", errors=ALL - {"ls", "grep"}),
    Case("empty", "", errors=ALL - {"ls", "grep"}),
    Case("blank", "   ", errors=ALL - {"ls", "grep"}),
    Case("blank-segment", "a/ /b"),
    Case("inner-dot", "a/./b"),
    Case("trailing-dotdot", "seed.txt/.."),
    Case("deep-escape", "x/../../../../etc/passwd"),
    Case("inner-double-slash", "a//b"),
    # absolute
    Case("absolute", "/etc/passwd"),
    Case("double-slash-absolute", "//etc/passwd"),
    Case("proc-root", "/proc/self/root/etc/passwd"),
    Case("proc-cwd", "/proc/self/cwd/x"),
    Case("windows-absolute", "C:\\Windows\\x"),
    Case("unc", "\\\\server\\share\\x"),
    Case("drive-relative", "c:x"),
    Case("drive-forward-slash", "C:/Windows/x"),
    Case("absolute-into-store", lambda store: str(store / "seed.txt")),
    # prefix confusion
    Case("prefix-confusion-relative", "../store_evil/x"),
    Case("prefix-confusion-absolute", lambda store: str(store.parent / "store_evil" / "x")),
    Case("prefix-confusion-link-absolute", "evil_link/x"),
    Case("prefix-confusion-link-relative", "evil_rel/x"),
    # NUL, unicode, control characters, lengths
    Case("nul", "a\x00/../../x"),
    Case("nul-suffix", "seed.txt\x00.png"),
    Case("fullwidth-dotdot", "．．／x"),
    Case("fullwidth-only-dots", "．．"),
    Case("two-dot-leader", "\u2025/x"),
    Case("fullwidth-nested", "a／．．／．．／x"),
    Case("fullwidth-backslash", "＼x"),
    Case("newline", "a\nb"),
    Case("carriage-return", "x\r"),
    Case("rtl-override", "\u202eevil.txt"),
    Case("name-4096", "a" * 4096),
    Case("segment-256", "a" * 256),
    Case("path-over-4096", "/".join(["a" * 200] * 21)),
    Case("too-deep", "/".join(["d"] * 65)),
    # planted links and special files
    Case("link-to-etc", "etc/passwd"),
    Case("link-to-etc-itself", "etc"),
    Case("link-to-real-etc", "realetc/passwd", errors=frozenset({"ls", "read", "grep"}), read_only=True),
    Case("link-to-real-etc-shadow", "realetc/shadow", errors=frozenset({"ls", "read", "grep"}), read_only=True),
    Case("link-to-parent", "up/x"),
    Case("link-to-parent-itself", "up"),
    Case("link-to-parent-sibling", "up/store_evil/x"),
    Case("chain-of-40", "loop0/canary.txt"),
    Case("chain-of-40-itself", "loop0"),
    Case("self-loop", "self/x"),
    Case("dangling-file", "dangling"),
    Case("dangling-dir", "dangdir/x"),
    Case("file-link-in-subdir", "sub/flink"),
    Case("link-to-dev-zero", "zero"),
    Case("hardlink-to-outside", "hard.txt", errors=CONTENT_OPS),
    Case("fifo", "fifo", errors=CONTENT_OPS),
    Case("char-device", "chardev", errors=CONTENT_OPS),
    # odd but legal names: literal, never decoded, confined
    confined("percent-2f", "..%2fx"),
    confined("percent-2e", "%2e%2e%2fx"),
    confined("double-encoded", "%252e%252e%252f"),
    confined("percent-00", "%00"),
    confined("dash-rf", "-rf"),
    confined("space-dotdot", " ../x"),
    confined("tilde", "~/x"),
    confined("dollar-home", "$HOME/x"),
    confined("zero-width", "..\u200b/x"),
    confined("combining", "e\u0301.txt"),
    confined("segment-255", "a" * 255),
    confined("three-dots", ".../x"),
    confined("fullwidth-letters", "ｓｅｅｄ２.txt"),
    confined("trailing-slash", "newdir/file/"),
]


def operations(path: str) -> list[tuple[str, str, dict[str, object]]]:
    return [
        ("ls", "ls", {"dir": path}),
        ("read", "read_file", {"path": path}),
        ("write", "write_file", {"path": path, "content": PWNED}),
        ("edit", "edit_file", {"path": path, "old_text": CANARY, "new_text": PWNED}),
        ("glob", "glob", {"pattern": path}),
        ("grep", "grep", {"pattern": "CANARY|root:|\\x00", "dir": path}),
        ("rename_from", "rename", {"old_path": path, "new_path": "moved-away"}),
        ("rename_to", "rename", {"old_path": "seed.txt", "new_path": path}),
        ("delete", "delete", {"path": path}),
    ]


def test_the_table_is_big_enough() -> None:
    assert len(CASES) >= 40
    assert len({case.id for case in CASES}) == len(CASES)


def build(kind: str, store: Path) -> FileSystem:
    default = WorkspaceFileSystem(store, ROOMY)
    if kind == "workspace":
        return default
    return CompositeFileSystem(default, {"routed": WorkspaceFileSystem(store.parent / "routed_store", ROOMY)})


@pytest.mark.parametrize("kind", ["workspace", "composite"])
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_hostile_path_against_every_tool(tmp_path: Path, case: Case, kind: str) -> None:
    store = plant(tmp_path)
    if case.id == "char-device" and not (store / "chardev").exists():
        pytest.skip("mknod is not permitted here")
    fs = build(kind, store)
    path = case.path(store) if callable(case.path) else case.path
    outside_before = snapshot(tmp_path, skip=store)
    links_before = links_in(store)
    for label, tool, arguments in operations(path):
        if case.read_only and label not in READ_ONLY:
            continue
        started = time.monotonic()
        result = run_file_tool(fs, tool, arguments)
        assert time.monotonic() - started < 5, f"{label} blocked"  # FIFOs and devices must not hang
        assert CANARY not in result, f"{label} leaked outside content: {result!r}"
        assert "root:x:0:0" not in result, f"{label} leaked: {result[:200]!r}"
        assert "\x00" not in result, f"{label} leaked: {result[:200]!r}"
        if label in case.errors:
            assert result.startswith("Error: "), f"{label} should be refused, got {result[:200]!r}"
        if case.confined and label == "write":
            assert result.startswith("Wrote "), result
            inside = store / validate_path(path)
            assert os.path.realpath(inside) == os.path.join(os.path.realpath(store), validate_path(path))
            assert inside.read_text() == PWNED
    assert snapshot(tmp_path, skip=store) == outside_before, "something outside the store changed"
    assert links_in(store) == links_before, "a planted link was followed, replaced or removed"
    assert (tmp_path / "outside" / "canary.txt").read_text() == CANARY


def test_glob_and_grep_never_walk_through_links(tmp_path: Path) -> None:
    store = plant(tmp_path)
    fs = WorkspaceFileSystem(store, ROOMY)
    listed = fs.glob("**")
    assert "seed.txt" in listed
    assert all(not name.startswith(("etc/", "realetc/", "up/", "loop", "evil_", "sub/flink")) for name in listed)
    assert "hard.txt" in listed  # listed (it is an entry of the store), but its content is refused:
    assert (
        run_file_tool(fs, "read_file", {"path": "hard.txt"})
        == "Error: Path escapes the store root via a link: hard.txt"
    )
    assert run_file_tool(fs, "grep", {"pattern": "CANARY|root"}) == "(no matches)"
    assert [entry.path for entry in fs.ls()] == ["sub", "hard.txt", "seed.txt"]


def test_fifo_read_does_not_block(tmp_path: Path) -> None:
    store = plant(tmp_path)
    fs = WorkspaceFileSystem(store)
    started = time.monotonic()
    assert run_file_tool(fs, "read_file", {"path": "fifo"}) == "Error: Not a regular file: fifo"
    assert run_file_tool(fs, "grep", {"pattern": "x", "dir": "fifo"}) == "(no matches)"
    assert time.monotonic() - started < 10  # a FIFO opened for reading blocks forever; loose for a loaded machine


def test_link_messages(tmp_path: Path) -> None:
    store = plant(tmp_path)
    fs = WorkspaceFileSystem(store)
    assert (
        run_file_tool(fs, "read_file", {"path": "etc/passwd"})
        == "Error: Path escapes the store root via a link: etc/passwd"
    )
    assert run_file_tool(fs, "write_file", {"path": "dangling", "content": "x"}) == (
        "Error: Path escapes the store root via a link: dangling"
    )
    assert run_file_tool(fs, "read_file", {"path": "zero"}) == "Error: Path escapes the store root via a link: zero"
    assert run_file_tool(fs, "ls", {"dir": "loop0"}) == "Error: Path escapes the store root via a link: loop0"
    assert not (tmp_path / "outside" / "new.txt").exists()


def test_a_root_that_is_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "store")
    fs = WorkspaceFileSystem(tmp_path / "store")
    assert (
        run_file_tool(fs, "write_file", {"path": "a", "content": "x"})
        == "Error: the store root is not a plain directory"
    )
    assert list((tmp_path / "real").iterdir()) == []


# ---- P3: a directory swapped for a link mid-operation


def _exchanger() -> Callable[[bytes, bytes], bool] | None:
    """Atomic swap of two names (renameat2 RENAME_EXCHANGE), or None when libc lacks it."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return None
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2

    def exchange(first: bytes, second: bytes) -> bool:
        return bool(renameat2(at_fdcwd, first, at_fdcwd, second, rename_exchange) == 0)

    return exchange


def _flip_without_exchange(store: Path, outside: Path) -> Callable[[bytes, bytes], bool]:
    """Fallback flipper: move the real dir aside and put a link in its place, then back."""
    state = {"linked": False}

    def flip(_first: bytes, _second: bytes) -> bool:
        try:
            if state["linked"]:
                os.unlink(store / "d")
                os.rename(store / "stash", store / "d")
            else:
                os.rename(store / "d", store / "stash")
                os.symlink(outside, store / "d")
            state["linked"] = not state["linked"]
        except OSError:
            return False
        return True

    return flip


@dataclass
class Attacker:
    """A thread flipping `store/d` between the real directory and a link to `outside`."""

    store: Path
    outside: Path
    flips: int = 0

    def __post_init__(self) -> None:
        os.symlink(self.outside, self.store / "swap")
        self._flip = _exchanger() or _flip_without_exchange(self.store, self.outside)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        first, second = bytes(self.store / "d"), bytes(self.store / "swap")
        while not self._stop.is_set():
            if self._flip(first, second):
                self.flips += 1

    def __enter__(self) -> Attacker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def race_setup(tmp_path: Path) -> tuple[Path, Path]:
    store, outside = tmp_path / "store", tmp_path / "outside"
    (store / "d").mkdir(parents=True)
    (store / "d" / "f").write_text("inside")
    outside.mkdir()
    (outside / "f").write_text(CANARY)
    (outside / "escape-marker.txt").write_text(CANARY)
    return store, outside


def test_symlink_swap_race_never_escapes(tmp_path: Path) -> None:
    store, outside = race_setup(tmp_path)
    fs = WorkspaceFileSystem(store, ROOMY)
    outcomes: Counter[str] = Counter()
    deadline = time.monotonic() + 6
    with Attacker(store, outside) as attacker:
        for index in range(10_000):
            if time.monotonic() > deadline:
                break
            wrote = run_file_tool(fs, "write_file", {"path": "d/f", "content": f"inside {index}"})
            read = run_file_tool(fs, "read_file", {"path": "d/f"})
            listed = run_file_tool(fs, "ls", {"dir": "d"})
            grepped = run_file_tool(fs, "grep", {"pattern": "CANARY", "dir": "d"})
            for text in (wrote, read, listed, grepped):
                assert CANARY not in text, text
                assert "escape-marker" not in text, text
            outcomes["write ok" if wrote.startswith("Wrote") else "write refused"] += 1
            outcomes["read ok" if read.startswith("inside") else "read refused"] += 1
    assert sorted(os.listdir(outside)) == ["escape-marker.txt", "f"], "a write landed outside the store"
    assert (outside / "f").read_text() == CANARY
    # Both states of the swap were really exercised (otherwise the test proves nothing).
    assert attacker.flips > 100
    for outcome in ("write ok", "write refused", "read ok", "read refused"):
        assert outcomes[outcome] > 0, outcomes


def test_the_race_harness_catches_a_naive_check_then_open(tmp_path: Path) -> None:
    """The same attacker defeats realpath-then-open quickly: the harness can see an escape."""
    store, outside = race_setup(tmp_path)
    real_root = os.path.realpath(store) + os.sep
    escapes = 0
    deadline = time.monotonic() + 5
    with Attacker(store, outside):
        while escapes == 0 and time.monotonic() < deadline:
            target = store / "d" / "f"
            try:
                if os.path.realpath(target).startswith(real_root) and CANARY in target.read_text():
                    escapes += 1
            except OSError:
                continue
    assert escapes > 0


# ---- P4: any string is rejected or confined

ALPHABET = [".", "/", "\\", "%", ":", "\x00", "．", "／", "＼", "‥", "a", "b", "C", "L", "2", " ", "\n", "~"]


@settings(
    max_examples=1000,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(path=st.text(alphabet=st.sampled_from(ALPHABET), max_size=24))
def test_any_path_is_rejected_or_confined(tmp_path: Path, path: str) -> None:
    store = tmp_path / "store"
    if not store.exists():
        store.mkdir()
        (tmp_path / "outside").mkdir()
        (tmp_path / "outside" / "canary.txt").write_text(CANARY)
        os.symlink(tmp_path / "outside", store / "L")  # a planted link inside the alphabet
        os.symlink("..", store / "C")
    before = snapshot(tmp_path, skip=store)
    fs = WorkspaceFileSystem(store, ROOMY)
    real_root = os.path.realpath(store)
    try:
        norm = validate_path(path)
    except WorkspaceError:
        with pytest.raises(WorkspaceError):
            fs.write(path, "x")
        return
    if norm.split("/")[0] in {"L", "C"}:  # through (or onto) a planted link: refused
        with pytest.raises(WorkspaceError, match=r"^Path escapes the store root via a link: "):
            fs.write(path, "x")
    else:
        fs.write(path, "x")
        assert os.path.realpath(store / norm) == os.path.join(real_root, norm)
        assert (store / norm).read_text() == "x"
        opened = StoreRoot(store, max_dirs=ROOMY.max_dirs).open_file(norm)
        assert opened is not None
        fd, _ = opened
        try:
            assert os.readlink(f"/proc/self/fd/{fd}").startswith(real_root + os.sep)
        finally:
            os.close(fd)
        assert fs.read(path) == "x"
        fs.delete(norm.split("/")[0])
    assert snapshot(tmp_path, skip=store) == before
