"""`atmosphere dev` and `make run` as a user runs them: real processes, real signals."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from atmosphere.cli.dev_layout import SERVICES
from atmosphere.testing import free_port, free_port_block, wait_until

from .conftest import ROOT
from .wsclient import ask

pytestmark = pytest.mark.timeout(120)


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def is_tool_worker(pid: int) -> bool:
    """A worker process of the sandbox's (it runs the app's tools), or one of eval's."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return b"atmosphere.sandbox.tool_worker" in command or b"atmosphere.sandbox.js.worker" in command


def alive(pids: set[int]) -> set[int]:
    live = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            live.add(pid)
    return live


class Output:
    """What a child process printed, via a log file (no pipe to fill up)."""

    def __init__(self, process: subprocess.Popen[bytes], path: Path) -> None:
        self.process = process
        self.path = path

    def read(self) -> str:
        return self.path.read_text(errors="replace")


@pytest.fixture
def ports() -> dict[str, int]:
    workers = len(SERVICES) - 1  # each service but ingress has a probe port: base, base+1...
    return {"nats": free_port(), "http": free_port(), "probe": free_port_block(workers), "grpc": free_port()}


@contextlib.contextmanager
def start(
    argv: list[str], tmp_path: Path, env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], Output]]:
    log = tmp_path / "output.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, like a terminal job
            env=env,
        )
    try:
        yield process, Output(process, log)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


async def wait_for_banner(output: Output, timeout: float = 60) -> None:
    async def ready() -> bool:
        if output.process.poll() is not None:
            raise AssertionError(f"exited early:\n{output.read()}")
        return "Ctrl-C stops everything" in output.read()

    await wait_until(ready, timeout=timeout, interval=0.2, what="the dev stack banner")


async def check_openai_and_admin(url: str, output: Output) -> None:
    """The OpenAI API is on, and admin reads answer to the token the banner printed (only)."""
    token = re.search(r"Authorization: Bearer (\S+)\)", output.read())
    assert token, output.read()
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        body = {"model": "echo", "messages": [{"role": "user", "content": "openai via dev"}]}
        completion = await client.post("/atmosphere/v1/chat/completions", json=body)
        assert completion.status_code == 200, completion.text
        assert completion.json()["choices"][0]["message"]["content"] == "openai via dev"
        assert (await client.get("/api/admin/agents")).status_code == 401
        agents = await client.get("/api/admin/agents", headers={"Authorization": f"Bearer {token[1]}"})
        assert agents.status_code == 200, agents.text
        assert "echo" in agents.text


def dev_args(ports: dict[str, int], home: Path) -> list[str]:
    return [
        "--home",
        str(home),
        "--nats-port",
        str(ports["nats"]),
        "--http-port",
        str(ports["http"]),
        "--probe-base-port",
        str(ports["probe"]),
        "--grpc-port",
        str(ports["grpc"]),
        "--no-model",  # the local model has its own end-to-end test
    ]


async def test_dev_serves_echo_restarts_crashes_and_leaves_no_orphans(ports: dict[str, int], tmp_path: Path) -> None:
    argv = [str(Path(sys.executable).parent / "atmosphere"), "dev", *dev_args(ports, tmp_path / "home")]
    with start(argv, tmp_path) as (process, output):
        await wait_for_banner(output)
        url = f"http://127.0.0.1:{ports['http']}"
        assert (await ask(url, "echo", "hello from dev"))[-1]["type"] == "complete"
        await check_openai_and_admin(url, output)
        # nats-server + six services (the sandbox's tool workers are its own children, not dev's)
        children = {pid for pid in descendants(process.pid) if not is_tool_worker(pid)}
        assert len(children) == 7, output.read()

        # A crashed service is restarted, and the stack keeps answering.
        tape = next(pid for pid in children if "atmosphere.tape" in Path(f"/proc/{pid}/cmdline").read_text())
        os.kill(tape, signal.SIGKILL)

        async def restarted() -> bool:
            return (
                "tape" in output.read()
                and "restarting in" in output.read()
                and len({pid for pid in alive(descendants(process.pid)) if not is_tool_worker(pid)}) == 7
            )

        await wait_until(restarted, timeout=30, interval=0.2, what="the tape to be restarted")
        assert (await ask(url, "echo", "after a crash"))[-1]["type"] == "complete"
        children = descendants(process.pid)

        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        assert process.wait(30) == 0, output.read()
        deadline = time.monotonic() + 5
        while alive(children) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert alive(children) == set(), output.read()


async def test_interrupting_make_run_leaves_no_process_behind(ports: dict[str, int], tmp_path: Path) -> None:
    run_args = " ".join(dev_args(ports, tmp_path / "home"))
    with start(["make", "--no-print-directory", "run", f"RUN_ARGS={run_args}"], tmp_path) as (process, output):
        await wait_for_banner(output, timeout=120)
        assert (await ask(f"http://127.0.0.1:{ports['http']}", "echo", "via make run"))[-1]["type"] == "complete"
        tree = descendants(process.pid)
        assert len(tree) >= 8  # atmosphere dev, nats-server, six services
        os.killpg(process.pid, signal.SIGINT)
        process.wait(30)
        deadline = time.monotonic() + 5
        while alive(tree) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert alive(tree) == set(), output.read()


async def exit_code(process: subprocess.Popen[bytes], timeout: float) -> int:
    """The process's exit code, waited for without blocking the loop (a test's servers keep answering)."""
    deadline = time.monotonic() + timeout
    while (code := process.poll()) is None:
        assert time.monotonic() < deadline, "still running"
        await asyncio.sleep(0.1)
    return code


async def test_a_second_stack_whose_probe_ports_answer_readyz_stops_before_starting_anything(
    ports: dict[str, int], tmp_path: Path
) -> None:
    async def another_stacks_readyz(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\n{"ready":true}')
        await writer.drain()
        writer.close()

    probes = [
        await asyncio.start_server(another_stacks_readyz, "127.0.0.1", ports["probe"] + i)
        for i in range(len(SERVICES) - 1)
    ]
    home = tmp_path / "home"
    argv = [str(Path(sys.executable).parent / "atmosphere"), "dev", *dev_args(ports, home)]
    try:
        with start(argv, tmp_path) as (process, output):
            assert await exit_code(process, 30) == 1, output.read()
            text = output.read()
    finally:
        for server in probes:
            server.close()
            await server.wait_closed()
    memory = ports["probe"] + 2  # dispatch, governance, memory, sandbox, tape: sorted from the base
    assert f"port 127.0.0.1:{memory} (memory's probe port) is already in use" in text
    assert "--probe-base-port" in text
    assert "Ctrl-C stops everything" not in text
    # Nothing started: no child's prefixed output, and no data of the broker or a service written.
    assert "| " not in text, text
    assert not home.exists()


async def test_an_invalid_grant_token_stops_the_stack_once_without_printing_it(
    ports: dict[str, int], tmp_path: Path
) -> None:
    token = "tok7chr"  # one short of the minimum of eight
    env = {**os.environ, "ATMOSPHERE_INGRESS__AUTH_TOKENS": f'[{{"token": "{token}", "user_id": "alice"}}]'}
    argv = [str(Path(sys.executable).parent / "atmosphere"), "dev", *dev_args(ports, tmp_path / "home")]
    with start(argv, tmp_path, env=env) as (process, output):
        assert await exit_code(process, 90) == 1, output.read()
        text = output.read()
    assert token not in text
    assert "ATMOSPHERE_INGRESS__AUTH_TOKENS[0].token: must be at least 8 characters" in text
    assert "its settings are invalid" in text
    assert "restarting in" not in text  # no service was restarted
    assert "Ctrl-C stops everything" not in text
    # Provisioning (the first to read the grants, with dispatch's settings) said it once, and
    # nothing after it started.
    assert sum("invalid settings" in line for line in text.splitlines()) == 1, text
    assert "provision failed (exit 78): its settings are invalid" in text
