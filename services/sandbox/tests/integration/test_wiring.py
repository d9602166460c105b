"""Sandbox's real `serve()` on a `FakeBus`: it loads the app from its settings and hosts its tools."""

from __future__ import annotations

import contextlib
import functools
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from atmosphere.bus import subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolDescriptor, ToolReply
from atmosphere.sandbox.app import serve
from atmosphere.sandbox.settings import SandboxSettings
from atmosphere.testing import running_service

APP_MODULE = "sandbox_wiring_app"
APP_SOURCE = '''
"""A tiny app for the wiring test: one agent with one tool."""

from atmosphere.sdk import App, agent, tool


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@agent(name="adder", tools=[add], harness=[])
class Adder:
    """Adds."""


app = App(agents=[Adder])
'''


@pytest.fixture
def app_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory holding the tiny app; the import path and the module are restored afterwards."""
    directory = tmp_path / "app"
    directory.mkdir()
    (directory / f"{APP_MODULE}.py").write_text(textwrap.dedent(APP_SOURCE))
    monkeypatch.syspath_prepend(str(directory))  # already there: `load_app` leaves sys.path alone
    monkeypatch.delitem(sys.modules, APP_MODULE, raising=False)  # restored (absent) after the test
    return directory


@contextlib.asynccontextmanager
async def sandbox(app_dir: Path) -> AsyncIterator[FakeBus]:
    """Sandbox served by its real `serve()` on a fresh `FakeBus`; stopped and awaited on exit."""
    bus = FakeBus()
    settings = SandboxSettings(
        app=f"{APP_MODULE}:app", app_dir=app_dir, data_dir=app_dir / "data", probe_host="127.0.0.1", probe_port=0
    )
    async with running_service("sandbox", functools.partial(serve, bus=bus), settings, bus=bus):
        yield bus


async def test_serve_publishes_and_hosts_the_apps_tools(app_dir: Path) -> None:
    async with sandbox(app_dir) as bus:
        descriptor = await bus.kv_get(subjects.TOOLS_BUCKET, "add", ToolDescriptor)
        result = await bus.request(
            subjects.tool("add"), ToolCall(call_id="c1", name="add", arguments_json='{"a": 2, "b": 3}'), ToolReply
        )
    assert descriptor is not None
    assert descriptor.provider == "sandbox"
    assert (result.call_id, result.content, result.is_error) == ("c1", "5", False)
