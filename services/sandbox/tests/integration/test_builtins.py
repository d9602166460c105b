"""The sandbox's own tools through its real `serve()`: offered only when they really run, and said so.

`atmo.svc.sandbox.info` reports what the probes found at start; `ATMO_TOOLS` holds a descriptor only
for a tool that is offered (a stale one from an earlier start is deleted); `code_exec` keeps a
session per run on this instance until the run's release; an app tool clashing with an enabled
built-in stops the service at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import shutil
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from atmosphere.bus import subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.service_pb2 import ServiceInfoRequest, ServiceInfoResponse
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolDescriptor, ToolKind, ToolReply
from atmosphere.sandbox.app import serve
from atmosphere.sandbox.code.settings import CodeSettings
from atmosphere.sandbox.js.settings import EvalSettings
from atmosphere.sandbox.settings import SandboxSettings
from atmosphere.service import AppLoadError
from atmosphere.testing import running_service, wait_until

APP_MODULE = "sandbox_builtins_app"
APP_SOURCE = '''
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
CLASHING_SOURCE = '''
from atmosphere.sdk import App, agent, tool


@tool
def code_exec(code: str) -> str:
    """My own code runner."""
    return code


@agent(name="mine", tools=[code_exec], harness=[])
class Mine:
    """Runs code its own way."""


app = App(agents=[Mine])
'''
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def write_app(directory: Path, module: str, source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    directory.mkdir(exist_ok=True)
    (directory / f"{module}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(directory))
    monkeypatch.delitem(sys.modules, module, raising=False)


@pytest.fixture
def app_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "app"
    write_app(directory, APP_MODULE, APP_SOURCE, monkeypatch)
    return directory


def settings_for(app_dir: Path, module: str = APP_MODULE, **overrides: Any) -> SandboxSettings:
    return SandboxSettings(
        app=f"{module}:app",
        app_dir=app_dir,
        data_dir=app_dir / "data",
        probe_host="127.0.0.1",
        probe_port=0,
        **overrides,
    )


@contextlib.asynccontextmanager
async def sandbox(settings: SandboxSettings, bus: FakeBus | None = None) -> AsyncIterator[FakeBus]:
    bus = bus or FakeBus()
    async with running_service("sandbox", functools.partial(serve, bus=bus), settings, bus=bus):
        yield bus


async def info_of(bus: FakeBus) -> dict[str, Any]:
    reply = await bus.request(subjects.service_info("sandbox"), ServiceInfoRequest(), ServiceInfoResponse)
    return dict(json.loads(reply.info_json)["sandbox"])


def code_call(code: str, *, run_id: str = "run-1", language: str = "python") -> ToolCall:
    arguments = json.dumps({"language": language, "code": code})
    return ToolCall(call_id="c1", name="code_exec", arguments_json=arguments, run_id=run_id)


async def test_by_default_neither_tool_is_offered_and_the_info_says_why(app_dir: Path) -> None:
    bus = FakeBus()
    async with sandbox(settings_for(app_dir), bus) as bus:
        info = await info_of(bus)
        offered = await bus.kv_items(subjects.TOOLS_BUCKET, ToolDescriptor)
    assert (info["code_exec"], info["eval"]) == ("INACTIVE(disabled)", "INACTIVE(disabled)")
    assert info["tools"] == ["add"]
    assert sorted(offered) == ["add"]


async def test_a_stale_offer_is_taken_back_when_the_tool_is_no_longer_enabled(app_dir: Path) -> None:
    with_code = settings_for(app_dir, code=CodeSettings(enabled=True, engine="docker"))
    bus = FakeBus()
    async with sandbox(settings_for(app_dir), bus):
        await bus.kv_put(subjects.TOOLS_BUCKET, "code_exec", ToolDescriptor(name="code_exec", provider="sandbox"))
    async with sandbox(with_code, bus):  # enabled, but no container engine answers here
        info = await info_of(bus)
        assert await bus.kv_get(subjects.TOOLS_BUCKET, "code_exec", ToolDescriptor) is None
    assert info["code_exec"].startswith("INACTIVE(docker: "), info
    assert info["code_exec"] != "INACTIVE(disabled)"


@needs_bwrap
@pytest.mark.usefixtures("sandbox_user")
async def test_code_exec_runs_in_bubblewrap_keeps_a_session_per_run_and_releases_it(app_dir: Path) -> None:
    settings = settings_for(app_dir, code=CodeSettings(enabled=True, engine="auto"))
    async with sandbox(settings) as bus:
        info = await info_of(bus)
        assert info["code_exec"] == "ACTIVE(bwrap)"
        descriptor = await bus.kv_get(subjects.TOOLS_BUCKET, "code_exec", ToolDescriptor)
        assert descriptor is not None
        assert (descriptor.provider, descriptor.kind) == ("sandbox", ToolKind.TOOL_KIND_EXECUTE)

        first = await bus.request(
            subjects.tool("code_exec"),
            code_call("open('kept.txt', 'w').write('from round one'); print(6 * 7)"),
            ToolReply,
            timeout=60,
        )
        assert not first.is_error, first.content
        assert json.loads(first.content)["stdout"].strip() == "42"
        assert json.loads(first.content)["exitCode"] == 0
        [step] = [e.agent_step for e in first.events if e.WhichOneof("kind") == "agent_step"]
        assert (step.step_name, step.description) == ("code_exec", "Ran python (exit 0)")
        instance = first.session_instance
        assert instance

        again = await bus.request(
            subjects.sandbox_session_tool(instance, "code_exec"),
            code_call("print(open('kept.txt').read())"),
            ToolReply,
            timeout=60,
        )
        assert json.loads(again.content)["stdout"].strip() == "from round one"
        other_run = await bus.request(
            subjects.tool("code_exec"),
            code_call("import os; print(os.path.exists('kept.txt'))", run_id="run-2"),
            ToolReply,
            timeout=60,
        )
        assert json.loads(other_run.content)["stdout"].strip() == "False"  # another run, another workspace

        await bus.publish(subjects.sandbox_release(instance), ToolCall(name="code_exec", run_id="run-1"))

        async def released() -> bool:
            reply = await bus.request(
                subjects.sandbox_session_tool(instance, "code_exec"),
                code_call("import os; print(os.path.exists('kept.txt'))"),
                ToolReply,
                timeout=60,
            )
            return json.loads(reply.content)["stdout"].strip() == "False"

        await wait_until(released, timeout=30, what="the released run's workspace to be gone")


async def test_eval_runs_in_a_v8_worker_when_enabled(app_dir: Path) -> None:
    settings = settings_for(app_dir, eval=EvalSettings(enabled=True))
    async with sandbox(settings) as bus:
        info = await info_of(bus)
        descriptor = await bus.kv_get(subjects.TOOLS_BUCKET, "eval", ToolDescriptor)
        reply = await bus.request(
            subjects.tool("eval"),
            ToolCall(call_id="e1", name="eval", arguments_json='{"code": "[1, 2].map(x => x * 21)"}'),
            ToolReply,
            timeout=30,
        )
    assert info["eval"] == "ACTIVE(mini-racer)"
    assert descriptor is not None
    assert descriptor.kind == ToolKind.TOOL_KIND_EXECUTE
    assert (reply.content, reply.is_error) == ("[21,42]", False)


@needs_bwrap
async def test_an_app_tool_clashing_with_an_enabled_builtin_stops_the_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "clash"
    write_app(directory, "sandbox_clashing_app", CLASHING_SOURCE, monkeypatch)
    settings = settings_for(directory, "sandbox_clashing_app", code=CodeSettings(enabled=True))
    with pytest.raises(AppLoadError, match="code_exec"):
        await serve(settings, stop=asyncio.Event(), bus=FakeBus())


def test_a_code_reply_too_large_for_one_message_drops_its_artifacts_not_the_call() -> None:
    from atmosphere.contracts.run.v1.run_pb2 import AgentStep, RunEvent, TextDelta
    from atmosphere.sandbox.builtins import _fitting

    reply = ToolReply(call_id="c1", content=json.dumps({"exitCode": 0, "stdout": "ok", "stderr": ""}))
    reply.events.append(RunEvent(agent_step=AgentStep(step_name="code_exec", description="Ran python (exit 0)")))
    reply.events.append(RunEvent(text_delta=TextDelta(text="![big.png](data:image/png;base64," + "A" * 200_000 + ")")))
    fitted = _fitting(reply, 64 * 1024)
    assert fitted.ByteSize() <= 64 * 1024
    assert [e.WhichOneof("kind") for e in fitted.events] == ["agent_step"]
    assert json.loads(fitted.content)["artifactsOmitted"] == 1
    small = ToolReply(call_id="c2", content="{}")
    assert _fitting(small, 64 * 1024) == small
