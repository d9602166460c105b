"""Sandbox unit-test support: a test module's tools hosted in-process or in tool workers.

`executor` runs each test that asks for it twice: with the tools in the test process (the
in-process executor, `None`), and in one tool worker process that imports the same test module
from its file. A module using it runs on one event loop (`loop_scope="module"`), so the worker
is started once per module, not once per test.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from atmosphere.sandbox.handlers import DEFAULT_MAX_RESULT_BYTES
from atmosphere.sandbox.worker_process import WorkerSpec
from atmosphere.sandbox.workers import ToolWorkers, worker_env

APP_MODULE = "tools_under_test_app"
APP_SOURCE = '''
"""The `TOOLS` of one test module, as the app a tool worker imports."""

import importlib.util

from atmosphere.sdk import App, agent

_spec = importlib.util.spec_from_file_location("tools_under_test", {path!r})
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)


@agent(name="tools-under-test", tools=list(_module.TOOLS.values()), harness=[])
class ToolsUnderTest:
    """Hosts the tools under test."""


app = App(agents=[ToolsUnderTest])
'''


def app_of_test_module(module_file: str, directory: Path) -> Path:
    """A directory holding an app made of the `TOOLS` of the test module at `module_file`."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{APP_MODULE}.py").write_text(textwrap.dedent(APP_SOURCE.format(path=module_file)))
    return directory


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["in-process", "workers"])
async def executor(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ToolWorkers | None]:
    """`None` (in-process), then a started one-worker pool with the test module's tools."""
    if request.param == "in-process":
        yield None
        return
    app_dir = app_of_test_module(str(request.module.__file__), tmp_path_factory.mktemp("tools-app"))
    spec = WorkerSpec(
        app=f"{APP_MODULE}:app",
        app_dir=app_dir,
        env=worker_env(os.environ),
        memory_bytes=512 << 20,
        max_content_bytes=DEFAULT_MAX_RESULT_BYTES,
        grace=0.5,
    )
    async with ToolWorkers(spec, count=1) as pool:
        yield pool
