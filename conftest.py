"""The suite's order: the files that take longest start first.

`make test` spreads the suite over parallel workers by file (pytest-xdist's `--dist loadfile`:
a file's module- and class-scoped stacks start once, on one worker), in the order collected. So
the end-to-end tests, then the contract tests, are collected first: the last file to finish is
a short one rather than a chaos test started late. (A test that needs a host-wide resource to
itself takes a lock across processes instead, such as `atmosphere.testing`'s `sandbox_user`.)
"""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

FIRST = ("tests/e2e/", "tests/contract/", "tests/")
"""Where the long tests are, longest first."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put the long files first (a stable sort: each file keeps its own order)."""
    root = config.rootpath
    items.sort(key=lambda item: _rank(PurePosixPath(item.path.relative_to(root)).as_posix()))


def _rank(path: str) -> int:
    return next((rank for rank, prefix in enumerate(FIRST) if path.startswith(prefix)), len(FIRST))
