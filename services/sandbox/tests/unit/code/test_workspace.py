"""The host's side of a workspace: collecting artifacts, measuring and removing, never following a link.

These run on the host alone (no sandbox): the code's moves are played by the test, including a
thread that keeps swapping files for links while the host collects (S3, the Judge0 class).
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from atmosphere.sandbox.code.artifacts import collect, display_name, mime_type
from atmosphere.sandbox.code.workspace import MAX_DEPTH, SessionDirectory, clear, unreachable


@pytest.fixture
def session(tmp_path: Path) -> SessionDirectory:
    return SessionDirectory(tmp_path / "root", "run/1:x", owner=None)


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    directory = tmp_path / "canary"
    directory.mkdir()
    (directory / "secret.txt").write_text("canary secret")
    return directory


def digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        h.update(str(path).encode() + (path.read_bytes() if path.is_file() and not path.is_symlink() else b""))
    return h.hexdigest()


def artifacts_of(session: SessionDirectory, max_count: int = 8, max_bytes: int = 1 << 20) -> tuple[list[str], int]:
    with session.open_workspace() as fd:
        found, dropped = collect(fd, max_count=max_count, max_bytes=max_bytes)
    return [f"{a.name}={a.data.decode(errors='replace')}" for a in found], dropped


def test_a_session_directory_is_made_private_and_removed(session: SessionDirectory) -> None:
    assert session.path.name.startswith("run_1_x-")
    assert (session.path.stat().st_mode & 0o777, session.workspace.stat().st_mode & 0o777) == (0o711, 0o700)
    assert (session.workspace / "artifacts").is_dir()
    (session.workspace / "a" / "b").mkdir(parents=True)
    (session.workspace / "a" / "b" / "f").write_text("x")
    session.remove()
    assert not session.path.exists()
    session.remove()  # idempotent


def test_only_regular_files_are_collected_never_through_links(
    session: SessionDirectory, canary: Path, tmp_path: Path
) -> None:
    art = session.workspace / "artifacts"
    (art / "b.txt").write_text("bee")
    (art / "a.csv").write_text("ay")
    (art / "link.txt").symlink_to(canary / "secret.txt")
    (art / "dirlink").symlink_to(canary)
    (art / "sub").mkdir()
    (art / "sub" / "inner.txt").write_text("inner")
    os.mkfifo(art / "fifo")  # opening it must not block
    assert artifacts_of(session) == (["a.csv=ay", "b.txt=bee"], 4)
    with session.open_workspace() as fd:
        session.reset_artifacts(fd)
    assert list(art.iterdir()) == []
    assert (canary / "secret.txt").read_text() == "canary secret"


def test_artifacts_are_bounded_by_count_and_bytes(session: SessionDirectory) -> None:
    art = session.workspace / "artifacts"
    for index in range(10):
        (art / f"f{index}.txt").write_text(str(index) * 10)
    assert artifacts_of(session, max_count=8)[1] == 2
    names, dropped = artifacts_of(session, max_bytes=25)  # two files of 10 bytes fit, the third does not
    assert (len(names), dropped) == (2, 8)
    (art / "big.bin").write_bytes(b"x" * 100)
    assert "big.bin=" + "x" * 100 not in artifacts_of(session, max_bytes=99)[0]


def test_an_artifacts_link_is_replaced_not_followed(session: SessionDirectory, canary: Path) -> None:
    art = session.workspace / "artifacts"
    art.rmdir()
    art.symlink_to(canary)
    assert artifacts_of(session) == ([], 1)
    with session.open_workspace() as fd:
        session.reset_artifacts(fd)
    assert art.is_dir()
    assert not art.is_symlink()
    assert (canary / "secret.txt").exists()


def test_names_and_types_are_safe_to_show() -> None:
    assert display_name("x](javascript:alert(1)).png") == "x__javascript:alert_1__.png"
    assert display_name("bad\udcff\n.txt") == "bad\ufffd_.txt"
    assert (mime_type("plot.png"), mime_type("data.csv"), mime_type("noext")) == (
        "image/png", "text/csv", "application/octet-stream",
    )  # fmt: skip


def test_collection_racing_a_swapper_reads_no_host_file(session: SessionDirectory, canary: Path) -> None:
    art = session.workspace / "artifacts"
    before = digest(canary)
    stop = threading.Event()

    def swap() -> None:  # what hostile code does inside the sandbox, as fast as it can
        target, staged = art / "x", art / ".staged"
        while not stop.is_set():
            for make in (lambda: staged.write_text("benign"), lambda: staged.symlink_to(canary / "secret.txt")):
                try:
                    make()
                    os.replace(staged, target)
                except OSError:
                    staged.unlink(missing_ok=True)

    swapper = threading.Thread(target=swap)
    swapper.start()
    seen: set[str] = set()
    collections = 0
    try:
        # At least 1,000 collections, and on until the swapper was seen at work: on a loaded
        # machine the thread may not be scheduled within the first thousand.
        while collections < 1000 or "x=benign" not in seen:
            seen.update(artifacts_of(session)[0])
            collections += 1
    finally:
        stop.set()
        swapper.join()
    assert not [item for item in seen if "canary" in item]
    assert digest(canary) == before


def test_measure_counts_blocks_and_gives_up_on_deep_or_huge_trees(session: SessionDirectory, canary: Path) -> None:
    (session.workspace / "data.bin").write_bytes(b"x" * 100_000)
    (session.workspace / "link").symlink_to(canary)
    usage = session.measure()
    assert usage.complete
    assert 100_000 <= usage.bytes < 200_000
    assert not usage.over(200_000)
    assert usage.over(50_000)
    deep = session.workspace
    for _ in range(MAX_DEPTH + 2):
        deep = deep / "d"
    deep.mkdir(parents=True)
    assert session.measure().over(1 << 40)


def test_clear_removes_a_tree_of_any_depth_and_locked_dirs(tmp_path: Path, canary: Path) -> None:
    top = tmp_path / "top"
    path = top
    for _ in range(300):  # deeper than the descriptors one would hold walking it recursively
        path = path / "d"
    path.mkdir(parents=True)
    (path / "leaf").write_text("x")
    (top / "link").symlink_to(canary)
    locked = top / "locked"
    (locked / "inner").mkdir(parents=True)
    locked.chmod(0o500)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        clear(fd)
    finally:
        os.close(fd)
    assert list(top.iterdir()) == []
    assert (canary / "secret.txt").exists()


def test_wipe_empties_the_workspace(session: SessionDirectory) -> None:
    (session.workspace / "keep").mkdir()
    (session.workspace / "keep" / "f").write_text("x")
    session.wipe()
    assert [p.name for p in session.workspace.iterdir()] == ["artifacts"]


def test_a_root_the_sandbox_user_cannot_pass_is_named(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    (closed / "root").mkdir(parents=True)
    closed.chmod(0o700)
    reason = unreachable(closed / "root", 65534, 65534)
    assert reason is not None
    assert str(closed) in reason
    assert "0700" in reason
    closed.chmod(0o711)
    assert not (unreachable(closed / "root", 65534, 65534) or "").startswith(
        f"{closed} "
    )  # pytest's own 0700 dirs may still be named
