"""The suite's order: the files that take longest start first.

`make test` spreads the suite over parallel workers by file (pytest-xdist's `--dist loadfile`:
a file's module- and class-scoped stacks start once, on one worker), in the order collected. So
the end-to-end tests, then the contract tests, are collected first: the last file to finish is
a short one rather than a chaos test started late. (A test that needs a host-wide resource to
itself takes a lock across processes instead, such as `atmosphere.testing`'s `sandbox_user`.)
"""

from __future__ import annotations

import _posixsubprocess
import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import NoReturn

import pytest

FIRST = ("tests/e2e/", "tests/contract/", "tests/")
"""Where the long tests are, longest first."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put the long files first (a stable sort: each file keeps its own order)."""
    root = config.rootpath
    items.sort(key=lambda item: _rank(PurePosixPath(item.path.relative_to(root)).as_posix()))


def _rank(path: str) -> int:
    return next((rank for rank, prefix in enumerate(FIRST) if path.startswith(prefix)), len(FIRST))


UNIT = "/tests/unit/"
"""Unit tests run in the test's own process: no child process and no real broker (those are
integration tests, in `tests/integration/` of the same library or service)."""

BROKER_FIXTURES = frozenset({"nats_url", "fresh_nats", "nats_bus", "docker_nats_url"})


def pytest_collection_finish(session: pytest.Session) -> None:
    """A unit test asking for a real nats-server is misplaced: said at collection, by name."""
    misplaced = [
        item.nodeid
        for item in session.items
        if UNIT in item.path.as_posix() and BROKER_FIXTURES & set(getattr(item, "fixturenames", ()))
    ]
    if misplaced:
        named = ", ".join(misplaced)
        raise pytest.UsageError(f"unit tests use no real nats-server (move them to integration/): {named}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    """A unit test's fixtures start no process either (a module-scoped one starts in its first test's setup)."""
    with _no_process_started(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Every way Python starts a process fails inside a unit test, naming the rule."""
    with _no_process_started(item):
        return (yield)


@contextlib.contextmanager
def _no_process_started(item: pytest.Item) -> Iterator[None]:
    if UNIT not in item.path.as_posix():
        yield
        return

    def refused(*_args: object, **_kwargs: object) -> NoReturn:
        msg = f"a unit test starts no process: {item.path.name} belongs in integration/"
        raise AssertionError(msg)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess, "_fork_exec", refused)
        patch.setattr(_posixsubprocess, "fork_exec", refused)
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp"):
            patch.setattr(os, name, refused)
        yield
