"""The suite's order: the files that take longest start first.

`make test` spreads the suite over parallel workers by file (pytest-xdist's `--dist loadfile`:
a file's module- and class-scoped stacks start once, on one worker), in the order collected. So
the longest files, then the other end-to-end and contract tests, are collected first: the last
file to finish is a short one rather than a chaos test started late. (A test that needs a host-wide resource to
itself takes a lock across processes instead, such as `atmosphere.testing`'s `sandbox_user`.)
"""

from __future__ import annotations

import _posixsubprocess
import contextlib
import fcntl
import importlib.util
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import NoReturn

import pytest

# Every framework adapter of the workspace is installed beside the built-in runtime and outranks
# it (priority 100): the suite's default dispatch pool runs the built-in runtime, which its
# scripted providers answer; the adapters' own tests name their pools. Children inherit it.
os.environ.setdefault("ATMOSPHERE_DISPATCH__RUNTIME", "built-in")
# The suite stays on loopback: LangSmith (the LangChain runtimes' tracing) is off whatever the
# environment says, set before any test runs LangChain (it caches what it first reads).
for _tracing in ("LANGSMITH_TRACING", "LANGSMITH_TRACING_V2", "LANGCHAIN_TRACING", "LANGCHAIN_TRACING_V2"):
    os.environ[_tracing] = "false"

PINNED_ENVIRONMENT = (
    "libs/runtime-crewai/",
    "libs/runtime-semantic-kernel/",
    "libs/runtime-llamaindex/",
    "tests/pinned/",
)
"""The tests of the pinned adapters (`envs/pinned`): their frameworks cannot be installed beside the
main environment's, so they run in `.venvs/pinned` (`make test-pinned`, a lane of `make test`) and
are not collected anywhere else."""


IN_PINNED_ENVIRONMENT = importlib.util.find_spec("crewai") is not None
"""Whether this is `.venvs/pinned` (CrewAI is installed nowhere else)."""


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave the pinned adapters' tests to their environment (and only them to it)."""
    if IN_PINNED_ENVIRONMENT or not collection_path.is_relative_to(config.rootpath):
        return None
    relative = collection_path.relative_to(config.rootpath).as_posix() + ("/" if collection_path.is_dir() else "")
    return True if relative.startswith(PINNED_ENVIRONMENT) else None


FIRST = (
    # The `alone` tests first: while they hold the room, the static gates and the dependency
    # floors (the other lanes of `make test`, busiest in their first minute) use the idle cores.
    "tests/e2e/test_chaos.py",
    "tests/e2e/test_resume_storm.py",
    # Then the longest files (seconds on two cores, `pytest -n 3 --durations=0`, December 2026),
    # so the suite does not end on one long file while two workers idle. Only the order depends
    # on these: a stale entry costs a few seconds, never a result.
    "tests/e2e/test_cluster_leader_loss.py",  # 90
    "tests/e2e/test_broker_restart.py",  # 58
    "tests/e2e/test_default_mode_takeover.py",  # 53
    "tests/e2e/test_own_project.py",  # 40
    "tests/e2e/test_runtime_pools.py",  # 40
    "tests/e2e/test_governance_recovery.py",  # 39
    # Not beside the broker and cluster tests above: its six processes each import four frameworks.
    "tests/e2e/test_runtime_adapters.py",  # 60
    "tests/e2e/test_provider_truth.py",  # 28
    "tests/e2e/hostile/test_ingress_agents.py",  # 27
    "tests/e2e/test_openai_approvals_and_retries.py",  # 27
    "tests/e2e/test_governance.py",  # 26
    "tests/contract/test_bus_contract.py",  # 26
    "tests/e2e/test_harness.py",  # 25
    "tests/contract/test_bus_replication.py",  # 24
    "tests/e2e/test_dev_cluster.py",  # 23
    "services/sandbox/tests/integration/test_tool_workers.py",  # 23
    "services/sandbox/tests/integration/code/test_escape.py",  # 18
    "libs/testing/tests/test_testing_env.py",  # 17
    # Then by place: end-to-end, contract, the other root tests, and the rest.
    "tests/e2e/",
    "tests/contract/",
    "tests/",
)
"""Where the long tests are, longest first (a path or a folder's prefix)."""


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


TURNSTILE = Path(tempfile.gettempdir()) / f"atmosphere-suite-turnstile-{os.getuid()}.lock"
ROOM = Path(tempfile.gettempdir()) / f"atmosphere-suite-room-{os.getuid()}.lock"
"""The suite's workers share the room; a test marked `alone` has it to itself (below)."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[object]:
    """A test marked `alone` runs with no other test of the parallel suite beside it.

    Such a test bounds a latency in wall time (a client's first frame during a resume storm, a
    chaos run's median): on two cores shared with other workers' stacks it would measure their
    load, not the platform. Every test of a parallel worker holds the room shared; an `alone`
    test waits for the tests under way to end and holds it exclusively. The turnstile stops new
    tests from entering while it waits, so it is not starved. One process (no xdist) needs none.
    """
    del nextitem
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return (yield)
    alone = item.get_closest_marker("alone") is not None
    with TURNSTILE.open("a") as turnstile, ROOM.open("a") as room:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            return (yield)
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)
            fcntl.flock(turnstile, fcntl.LOCK_UN)
