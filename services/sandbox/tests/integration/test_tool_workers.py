"""The app's tools run in worker processes: a tool that crashes, hangs, leaks or floods costs its worker.

Every test runs a real pool of `python -m atmosphere.sandbox.tool_worker` processes on a tiny app
written to `tmp_path`, with small limits (1 s tool timeouts, a 0.5 s grace, 256 MiB of memory).
After each misbehaving call: the call is an `Error: ...` naming its tool, the test process (the
service) is unharmed, and the next call of another tool succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import os
import signal
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from atmosphere.bus import JetStreamLayout, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolReply
from atmosphere.sandbox.app import serve
from atmosphere.sandbox.handlers import ToolHost
from atmosphere.sandbox.outcome import ResultLimits, ToolOutcome
from atmosphere.sandbox.settings import SandboxOptions, SandboxSettings
from atmosphere.sandbox.worker_memory import MemoryCgroup
from atmosphere.sandbox.worker_process import WorkerProcess, WorkerSpec
from atmosphere.sandbox.worker_stops import Closing
from atmosphere.sandbox.workers import ToolWorkers, ToolWorkersError, _Slot, spec_from, tool_workers, worker_env
from atmosphere.sdk import Tool
from atmosphere.sdk.host import load_app
from atmosphere.testing import running_service

MIB = 1024 * 1024
APP_MODULE = "tool_workers_app"
APP_SOURCE = '''
"""Tools that misbehave in every way a tool worker must survive, and a few well-behaved ones."""

import asyncio
import ctypes
import os
import sys
import time

from atmosphere.sdk import App, agent, tool


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
async def pid_after(seconds: float) -> int:
    """The worker's pid, after a while."""
    await asyncio.sleep(seconds)
    return os.getpid()


@tool
def env(name: str) -> str:
    """An environment variable of the worker."""
    return os.environ.get(name, "<unset>")


@tool
def segfault() -> str:
    """Crash the interpreter."""
    return str(ctypes.string_at(0))


@tool
def leak() -> str:
    """Allocate without bound (up to 2 GiB: a limit that fails fails the test, not the machine)."""
    hoard = [b"x" * (8 << 20) for _ in range(256)]
    return f"allocated {len(hoard) * 8} MiB unhindered"


@tool(timeout=1)
def spin() -> str:
    """Never return (sync, busy)."""
    while True:
        pass


@tool(timeout=1)
def sleep_forever() -> str:
    """Never return (sync, asleep)."""
    time.sleep(10**6)
    return "late"


@tool(timeout=600)
def sleep_through_close() -> str:
    """Never return (sync, asleep), with a deadline no loaded machine reaches: in flight when the pool closes."""
    time.sleep(10**6)
    return "late"


@tool(timeout=1)
async def wait_forever() -> str:
    """Never return (async)."""
    await asyncio.Event().wait()
    return "late"


@tool(timeout=1)
async def block_the_loop() -> str:
    """Never return, blocking the worker's event loop."""
    time.sleep(10**6)
    return "late"


@tool
def flood(megabytes: int) -> str:
    """Print that many MiB."""
    line = "z" * 1023
    for _ in range(megabytes * 1024):
        print(line)
    return "flooded"


@tool
def huge(megabytes: int) -> str:
    """Return that many MiB."""
    return "y" * (megabytes << 20)


@tool
def forge_frame() -> str:
    """Write a 2 GiB frame length on the worker's reply pipe."""
    fd = int(sys.argv[sys.argv.index("--replies-fd") + 1])
    os.write(fd, (2**31).to_bytes(4, "big"))
    time.sleep(10)
    return "late"


@tool
def exit_now(status: int) -> str:
    """End the worker's process."""
    os._exit(status)


@agent(
    name="misbehaving",
    tools=[add, pid_after, env, segfault, leak, spin, sleep_forever, sleep_through_close, wait_forever,
           block_the_loop, flood, huge, forge_frame, exit_now],
    harness=[],
)
class Misbehaving:
    """Hosts the tools."""


app = App(agents=[Misbehaving])
'''


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "app"
    directory.mkdir()
    (directory / f"{APP_MODULE}.py").write_text(textwrap.dedent(APP_SOURCE))
    return directory


Tools = dict[str, Tool[Any, Any]]


@pytest.fixture
def tools(app_dir: Path) -> Tools:
    """The app's tools as the service (the parent) holds them."""
    return dict(load_app(f"{APP_MODULE}:app", app_dir=app_dir).tools)


def spec(app_dir: Path, **overrides: Any) -> WorkerSpec:
    base = WorkerSpec(
        app=f"{APP_MODULE}:app",
        app_dir=app_dir,
        env=worker_env(os.environ),
        memory_bytes=256 * MIB,
        max_content_bytes=4 * MIB,
        grace=0.5,
        stop_timeout=1.0,
    )
    return dataclasses.replace(base, **overrides)


@contextlib.asynccontextmanager
async def pool(app_dir: Path, *, count: int = 2, **overrides: Any) -> AsyncIterator[ToolWorkers]:
    """A started pool; on exit closed, and no worker process or cgroup of it left."""
    workers = ToolWorkers(spec(app_dir, **overrides), count=count)
    await workers.start()
    try:
        yield workers
    finally:
        await workers.close()
        assert_nothing_left()


LIMITS = ResultLimits(inline_bytes=MIB, result_bytes=4 * MIB)


async def run(workers: ToolWorkers, tools: Tools, name: str, /, **arguments: Any) -> str:
    """The text of one call of `name` on the pool (a result or an `Error: ...`)."""
    call = ToolCall(call_id="c", run_id="r", name=name, arguments_json=json.dumps(arguments))
    outcome = await workers.run(tools[name], call, arguments, LIMITS)
    assert isinstance(outcome, ToolOutcome)
    return outcome.text


async def eventually(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, f"timed out after {timeout:g}s waiting for {what}"
        await asyncio.sleep(0.02)


def busy(workers: ToolWorkers) -> bool:
    return any(w.load for w in workers._workers)


def children() -> list[int]:
    """Tool-worker processes whose parent is this test process (other suites' children are theirs to check)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                status = (entry / "status").read_text()
                command = (entry / "cmdline").read_bytes()
                if f"\nPPid:\t{os.getpid()}\n" in status and b"atmosphere.sandbox.tool_worker" in command:
                    found.append(int(entry.name))
    return found


def worker_processes() -> list[int]:
    """Tool workers started by this test process, wherever they are now."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if b"atmosphere.sandbox.tool_worker" in argv and str(os.getpid()).encode() in argv:
                    found.append(int(entry.name))
    return found


def probe_cgroup() -> MemoryCgroup | str:
    """A memory cgroup as a worker would get (removed again), or why there is none here."""
    probe = MemoryCgroup.create(64 * MIB)
    if isinstance(probe, MemoryCgroup):
        assert probe.remove()
    return probe


def leftover_cgroups() -> list[Path]:
    probe = probe_cgroup()
    if isinstance(probe, str):
        return []
    return sorted(probe.path.parent.glob(f"atmosphere-tool-worker-{os.getpid()}-*"))


def assert_nothing_left() -> None:
    assert children() == []
    assert worker_processes() == []
    assert leftover_cgroups() == []


async def test_a_call_runs_in_a_worker_process(app_dir: Path, tools: Tools) -> None:
    async with pool(app_dir, count=1) as workers:
        assert await run(workers, tools, "add", a=2, b=3) == "5"
        pid = int(await run(workers, tools, "pid_after", seconds=0))
        assert pid != os.getpid()
        assert workers.pids() == [pid]


async def test_a_start_cancelled_at_any_step_leaves_no_process(app_dir: Path) -> None:
    # The pool closing while a replacement starts cancels its start wherever it is: between the
    # spawn and the worker (its pipes being wrapped), one was left running (a floors run).
    for steps in range(40):  # past the spawn, the pipes and into the handshake
        starting = asyncio.create_task(WorkerProcess.start(spec(app_dir), f"cancelled after {steps} steps"))
        for _ in range(steps):
            await asyncio.sleep(0)
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await (await starting).stop(Closing())  # it started in time: stopped as the pool would
        assert children() == [], f"cancelled after {steps} steps"
    assert_nothing_left()


async def test_a_segfault_costs_the_worker_not_the_service(app_dir: Path, tools: Tools) -> None:
    async with pool(app_dir) as workers:
        before = set(workers.pids())
        text = await run(workers, tools, "segfault")
        assert text == "Error: the tool worker running segfault crashed (signal SIGSEGV); the call was not completed"
        assert await run(workers, tools, "add", a=1, b=1) == "2"
        await eventually(lambda: len(workers.ready_pids()) == 2, "the worker replaced")
        assert len(before - set(workers.pids())) == 1


@pytest.mark.parametrize("guard", ["cgroup", "watchdog"])
async def test_a_tool_over_its_memory_costs_the_worker(app_dir: Path, tools: Tools, guard: str) -> None:
    if guard == "cgroup" and isinstance(reason := probe_cgroup(), str):
        pytest.skip(f"no memory cgroup here: {reason}")
    async with pool(app_dir, use_cgroup=guard == "cgroup") as workers:
        in_cgroup = ["atmosphere-tool-worker-" in Path(f"/proc/{pid}/cgroup").read_text() for pid in workers.pids()]
        assert in_cgroup == [guard == "cgroup"] * 2
        assert await run(workers, tools, "leak") == "Error: leak used more than 256 MiB; its worker was stopped"
        assert await run(workers, tools, "add", a=2, b=2) == "4"


@pytest.mark.parametrize(
    ("name", "expected", "recycled"),
    [
        ("spin", "Error: spin did not finish within 1s", True),
        ("sleep_forever", "Error: sleep_forever did not finish within 1s", True),
        ("wait_forever", "Error: wait_forever did not finish within 1s", False),
        ("block_the_loop", "Error: block_the_loop did not finish within 1s; its worker was stopped", True),
    ],
)
async def test_a_tool_that_never_returns_ends_within_its_timeout_and_the_grace(
    app_dir: Path, tools: Tools, name: str, expected: str, recycled: bool
) -> None:
    async with pool(app_dir, count=1) as workers:
        [pid] = workers.pids()
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await run(workers, tools, name) == expected
        # The tool's timeout and the grace, and slack for a loaded machine (the floors lane runs niced
        # beside the suite): uncut, each of these calls never returns.
        assert 1 <= loop.time() - started < 1 + 0.5 + 10
        assert await run(workers, tools, "add", a=3, b=4) == "7"
        if recycled:  # a thread that cannot be stopped, or a wedged loop: that worker is gone
            await eventually(lambda: pid not in workers.pids(), "the worker recycled")
        else:
            assert workers.pids() == [pid]


async def test_a_flood_of_output_is_drained_and_its_log_bounded(
    app_dir: Path, tools: Tools, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="atmosphere.sandbox.tools")
    async with pool(app_dir, count=1) as workers:
        [pid] = workers.pids()
        assert await run(workers, tools, "flood", megabytes=100) == "flooded"
        assert await run(workers, tools, "add", a=5, b=5) == "10"
        assert workers.pids() == [pid]  # printing is no reason to stop a worker
    logged = [r for r in caplog.records if r.name == "atmosphere.sandbox.tools"]
    assert sum(len(r.getMessage()) for r in logged) < 64 * 1024
    assert any("z" * 1000 in r.getMessage() for r in logged)  # the first lines are logged
    dropped = [int(r.getMessage().split(": ")[1].split()[0]) for r in logged if "were not logged" in r.getMessage()]
    assert sum(dropped) > 99 * MIB  # the rest only counted


async def test_a_100_mib_result_is_cut_by_the_worker_before_it_travels(app_dir: Path, tools: Tools) -> None:
    bus = FakeBus(max_payload=1 * MIB)
    await bus.provision(JetStreamLayout())
    async with pool(app_dir, count=1, memory_bytes=512 * MIB, max_content_bytes=2 * MIB) as workers:
        host = ToolHost(tools, max_payload=bus.max_payload, objects=bus, max_result_bytes=2 * MIB, executor=workers)
        async with bus.serve(host.router()):
            call = ToolCall(call_id="c1", name="huge", arguments_json='{"megabytes": 100}')
            reply = await bus.request(subjects.tool("huge"), call, ToolReply, timeout=30)
            stored = await bus.object_get(subjects.TOOL_RESULTS_BUCKET, reply.result_object)
            follow = await bus.request(
                subjects.tool("add"), ToolCall(call_id="c2", name="add", arguments_json='{"a": 1, "b": 2}'), ToolReply
            )
    assert (reply.is_error, reply.truncated) == (False, True)
    assert stored is not None
    assert len(stored) <= 2 * MIB
    kept, _, marker = stored.decode().rpartition("\n")
    assert kept == "y" * len(kept)
    assert (
        marker == f"…[truncated: the result of huge is {100 * MIB} bytes; only the first {len(kept)} bytes are shown]"
    )
    assert follow.content == "3"


async def test_a_frame_over_the_cap_stops_the_worker(app_dir: Path, tools: Tools) -> None:
    async with pool(app_dir, count=1) as workers:
        text = await run(workers, tools, "forge_frame")
        assert text.startswith("Error: the tool worker running forge_frame was stopped (it answered with a frame of")
        assert text.endswith("; the call was not completed")
        assert await run(workers, tools, "add", a=0, b=0) == "0"


async def test_an_exit_of_the_worker_is_an_error(app_dir: Path, tools: Tools) -> None:
    async with pool(app_dir, count=1) as workers:
        text = await run(workers, tools, "exit_now", status=3)
        assert text == (
            "Error: the tool worker running exit_now exited unexpectedly (exit status 3); the call was not completed"
        )
        assert await run(workers, tools, "add", a=1, b=0) == "1"


async def test_a_workers_end_is_counted_by_reason_and_its_calls_outcomes_named(app_dir: Path, tools: Tools) -> None:
    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    live = sample("atmosphere_sandbox_workers", kind="tool")
    before = {r: sample("atmosphere_sandbox_kills_total", kind="tool", reason=r) for r in ("timeout", "crashed")}
    async with pool(app_dir, count=1) as workers:
        assert sample("atmosphere_sandbox_workers", kind="tool") == live + 1
        call = ToolCall(call_id="c", run_id="r", name="block_the_loop", arguments_json="{}")
        wedged = await workers.run(tools["block_the_loop"], call, {}, LIMITS)
        call = ToolCall(call_id="c", run_id="r", name="exit_now", arguments_json='{"status": 3}')
        exited = await workers.run(tools["exit_now"], call, {"status": 3}, LIMITS)
        assert (wedged.timed_out, wedged.killed) == (True, True)  # the culprit of its worker's deadline
        assert (exited.timed_out, exited.killed) == (False, True)
        await eventually(lambda: len(workers.ready_pids()) == 1, "the worker replaced")
        assert sample("atmosphere_sandbox_workers", kind="tool") == live + 1
    after = {r: sample("atmosphere_sandbox_kills_total", kind="tool", reason=r) for r in ("timeout", "crashed")}
    assert {r: after[r] - before[r] for r in after} == {"timeout": 1, "crashed": 1}
    assert sample("atmosphere_sandbox_workers", kind="tool") == live  # closing is no kill, and leaves none


async def test_concurrent_calls_spread_over_the_workers(app_dir: Path, tools: Tools) -> None:
    async with pool(app_dir) as workers:
        pids = await asyncio.gather(*(run(workers, tools, "pid_after", seconds=0.3) for _ in range(4)))
        assert {int(p) for p in pids} == set(workers.pids())
        assert len(set(pids)) == 2


async def test_a_worker_killed_from_outside_is_replaced(app_dir: Path, tools: Tools) -> None:
    async with pool(app_dir, count=1) as workers:
        [pid] = workers.pids()
        in_flight = asyncio.create_task(run(workers, tools, "pid_after", seconds=5))
        await eventually(lambda: busy(workers), "the call in flight")
        os.kill(pid, signal.SIGKILL)
        assert await in_flight == (
            "Error: the tool worker running pid_after crashed (signal SIGKILL); the call was not completed"
        )
        assert await run(workers, tools, "add", a=2, b=5) == "7"
        assert pid not in workers.pids()


async def test_calls_in_flight_at_close_end_with_an_error_and_nothing_is_left(app_dir: Path, tools: Tools) -> None:
    async with pool(app_dir) as workers:
        # Not `sleep_forever`: its 1 s deadline could pass before `close()` on a loaded machine.
        stuck = asyncio.create_task(run(workers, tools, "sleep_through_close"))
        await eventually(lambda: busy(workers), "the call in flight")
        assert len(worker_processes()) == 2
        await workers.close()
        assert await stuck == (
            "Error: the tool worker running sleep_through_close stopped (the sandbox is shutting down); "
            "the call was not completed"
        )
        assert_nothing_left()
        assert (await run(workers, tools, "add", a=1, b=1)).startswith("Error: the sandbox is shutting down")


async def test_an_app_that_cannot_load_in_a_worker_is_a_clear_error(app_dir: Path) -> None:
    with pytest.raises(ToolWorkersError, match=r"the tool workers cannot start: cannot load ATMOSPHERE_APP='nope:app'"):
        await ToolWorkers(spec(app_dir, app="nope:app")).start()
    assert_nothing_left()


async def test_workers_that_stop_starting_fail_calls_at_once_until_they_start_again(
    app_dir: Path, tools: Tools
) -> None:
    source = app_dir / f"{APP_MODULE}.py"
    async with pool(app_dir, count=1) as workers:
        [pid] = workers.pids()
        working = source.read_text()
        source.write_text('raise RuntimeError("the database is gone")\n')
        os.kill(pid, signal.SIGKILL)
        await eventually(lambda: workers._slots[0].start_error != "", "a failed start")
        text = await run(workers, tools, "add", a=1, b=2)
        assert text.startswith("Error: the tool workers cannot start (")
        assert "the database is gone" in text
        assert text.endswith("; add was not run")
        source.write_text(working)
        await eventually(lambda: workers.ready_pids() != [], "a worker started again", timeout=15)
        assert await run(workers, tools, "add", a=1, b=2) == "3"


def test_restarts_back_off_while_workers_die_young() -> None:
    slot = _Slot(0)
    delays = []
    for failures in range(1, 9):
        slot.failures = failures
        delays.append(slot.backoff())
    assert delays == [0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 10.0]


async def test_workers_get_the_services_environment_but_not_its_bus_settings(app_dir: Path, tools: Tools) -> None:
    env = {**os.environ, "WEATHER_API_KEY": "k-123", "ATMOSPHERE_NATS__URL": "nats://user:secret@127.0.0.1:4222"}
    async with pool(app_dir, count=1, env=worker_env(env)) as workers:
        assert await run(workers, tools, "env", name="WEATHER_API_KEY") == "k-123"
        assert await run(workers, tools, "env", name="ATMOSPHERE_NATS__URL") == "<unset>"


def test_the_settings_give_the_pool_its_limits(app_dir: Path) -> None:
    options = SandboxOptions(tool_workers=3, tool_worker_memory_bytes=300 * MIB, tool_worker_grace_seconds=0.25)
    settings = SandboxSettings(app=f"{APP_MODULE}:app", app_dir=app_dir, sandbox=options)
    made = spec_from(settings, env={"PATH": "/usr/bin", "ATMOSPHERE_NATS__URL": "nats://x"})
    assert (made.memory_bytes, made.grace, made.max_content_bytes) == (300 * MIB, 0.25, options.max_result_bytes)
    assert made.env == {"PATH": "/usr/bin"}
    assert made.app_dir.is_absolute()
    assert SandboxOptions().tool_workers == 2


async def test_serve_drains_the_calls_in_flight_before_it_stops_the_workers(app_dir: Path, tmp_path: Path) -> None:
    bus = FakeBus()
    options = SandboxOptions(tool_workers=1, tool_worker_memory_bytes=256 * MIB, tool_worker_grace_seconds=0.5)
    settings = SandboxSettings(
        app=f"{APP_MODULE}:app",
        app_dir=app_dir,
        data_dir=tmp_path / "data",
        probe_host="127.0.0.1",
        probe_port=0,
        sandbox=options,
    )
    async with running_service("sandbox", functools.partial(serve, bus=bus), settings, bus=bus):
        [pid] = worker_processes()
        call = ToolCall(call_id="c1", name="pid_after", arguments_json='{"seconds": 0.5}')
        in_flight = asyncio.create_task(bus.request(subjects.tool("pid_after"), call, ToolReply, timeout=10))
        await asyncio.sleep(0.2)
    reply = await in_flight  # the service stopped after answering it
    assert (reply.is_error, reply.content) == (False, str(pid))
    assert_nothing_left()


SERVICE_SCRIPT = """
import asyncio, os, sys
from pathlib import Path
from atmosphere.sandbox.worker_process import WorkerSpec
from atmosphere.sandbox.workers import ToolWorkers, worker_env

async def main():
    spec = WorkerSpec(app=sys.argv[1], app_dir=Path(sys.argv[2]), env=worker_env(os.environ),
                      memory_bytes=256 << 20, max_content_bytes=1 << 20)
    workers = ToolWorkers(spec, count=1)
    await workers.start()
    print(workers.pids()[0], flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


def alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status  # a zombie has ended; only its parent has not reaped it yet


async def test_workers_end_with_a_service_that_is_killed(app_dir: Path) -> None:
    service = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SERVICE_SCRIPT, f"{APP_MODULE}:app", str(app_dir), stdout=asyncio.subprocess.PIPE
    )
    assert service.stdout is not None
    worker = int(await asyncio.wait_for(service.stdout.readline(), 30))
    assert alive(worker)
    service.kill()
    await service.wait()
    await eventually(lambda: not alive(worker), "the orphaned worker to end")
    if isinstance(probe := probe_cgroup(), MemoryCgroup):  # the next pool removes the dead service's cgroup
        stale = f"atmosphere-tool-worker-{service.pid}-*"
        assert len(list(probe.path.parent.glob(stale))) == 1
        async with pool(app_dir, count=1):
            assert list(probe.path.parent.glob(stale)) == []


def test_the_pool_runs_on_uvloop(app_dir: Path, tools: Tools) -> None:
    uvloop = pytest.importorskip("uvloop")  # what `atmosphere.service.run` runs the service on when installed

    async def scenario() -> None:
        async with pool(app_dir, count=1) as workers:
            assert await run(workers, tools, "add", a=1, b=2) == "3"
            assert "crashed (signal SIGSEGV)" in await run(workers, tools, "segfault")
            assert await run(workers, tools, "add", a=2, b=2) == "4"

    uvloop.run(scenario())


async def test_no_workers_for_zero_or_for_an_app_without_tools(app_dir: Path, tools: Tools) -> None:
    in_process = SandboxSettings(app=f"{APP_MODULE}:app", app_dir=app_dir, sandbox=SandboxOptions(tool_workers=0))
    async with tool_workers(in_process, tools) as executor:
        assert executor is None
    async with tool_workers(SandboxSettings(app=f"{APP_MODULE}:app", app_dir=app_dir), {}) as executor:
        assert executor is None
    assert_nothing_left()
