"""`atmosphere dev` as a child process of a test: free ports, its output in a file, its banner awaited."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

from atmosphere.cli.dev_layout import SERVICES
from atmosphere.testing import ScriptedModel, ToolCallScript, Turn, free_port, free_port_block, wait_until

from .wsclient import ask

BANNER_END = "Ctrl-C stops everything"
"""The last line of `atmosphere dev`'s banner: every service is ready."""


@contextlib.contextmanager
def started(argv: list[str], *, cwd: Path, env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run `argv` in a process group of its own, its output in `log`; killed with its group at the end."""
    with log.open("wb") as sink:
        process = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def port_args() -> list[str]:
    """`atmosphere dev`'s port options, each a free port (a test cannot rely on 8080 being free)."""
    return [
        "--nats-port",
        str(free_port()),
        "--http-port",
        str(free_port()),
        "--probe-base-port",
        str(free_port_block(len(SERVICES) - 1)),  # a probe port for each service but ingress
        "--grpc-port",
        str(free_port()),
    ]


def port_of(args: list[str], option: str) -> int:
    """The port `args` give `option` (`--http-port`)."""
    return int(args[args.index(option) + 1])


async def wait_for_banner(process: subprocess.Popen[bytes], log: Path) -> None:
    """Until the stack's banner is out; fails at once (with its output) when the process ends first."""

    async def banner() -> bool:
        assert process.poll() is None, log.read_text()
        return BANNER_END in log.read_text()

    await wait_until(banner, timeout=120, interval=0.2, what="the dev stack banner")


async def serves_the_counter(command: list[str], *, cwd: Path, env: dict[str, str], log: Path) -> None:
    """`command` (an `atmosphere dev` serving the starter's `counter` agent) answers with its tool.

    A scripted model calls `word_count`; the run over a WebSocket shows its result and the answer;
    Ctrl-C then stops the stack cleanly.
    """
    provider = ScriptedModel().script(
        Turn.tool_calls(ToolCallScript("word_count", {"text": "one two three"}, call_id="call_count")),
        Turn.text("Three words."),
    )
    async with provider.serving():
        ports = port_args()
        served = {**env, "LLM_BASE_URL": provider.base_url}
        with started([*command, *ports, "--no-model"], cwd=cwd, env=served, log=log) as process:
            await wait_for_banner(process, log)
            http = f"http://127.0.0.1:{port_of(ports, '--http-port')}"
            frames = await ask(http, "counter", "How many words in 'one two three'?")
            results = [f["data"] for f in frames if f.get("event") == "tool-result"]
            assert [(r["toolName"], str(r["result"])) for r in results] == [("word_count", "3")], frames
            assert frames[-1]["type"] == "complete", frames
            assert "".join(str(f["data"]) for f in frames if f.get("type") == "streaming-text") == "Three words."
            os.killpg(process.pid, signal.SIGINT)
            assert process.wait(60) == 0, log.read_text()
    assert provider.requests[0]["tools"][0]["function"]["name"] == "word_count"
