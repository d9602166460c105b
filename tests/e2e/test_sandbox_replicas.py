"""Two sandbox replicas share the tool calls; killing one with SIGKILL mid-call hangs no run.

20 runs call a slow tool at once (half of them one declared idempotent). One replica is killed
while calls are in flight. Every run must reach a terminal frame: a call the dead replica held is
an error for the model (dispatch waits the tool's deadline plus a grace, then says so), or, for
the idempotent tool, a second call the surviving replica answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from atmosphere.bus import NatsBus
from atmosphere.testing import ModelRequest, ScriptedModel, ToolCallScript, Turn, run_stack, wait_until

from .apps.replicas_app import LEDGER_ENV
from .conftest import ROOT, service_map
from .wsclient import ws_url

APP = "tests.e2e.apps.replicas_app:app"
RUNS = 20
_TAG = re.compile(r"run-\d+")


def respond(request: ModelRequest) -> Turn:
    """The model: call the run's tool (even runs the idempotent one), then repeat what it said."""
    messages = request["messages"]
    tag = _TAG.findall(next(m["content"] for m in messages if m["role"] == "user"))[0]
    if messages[-1]["role"] == "tool":
        return Turn.text(f"{tag}: {messages[-1]['content']}")
    name = "slow_lookup" if int(tag.split("-")[1]) % 2 == 0 else "slow_note"
    return Turn.tool_calls(ToolCallScript(name, {"tag": tag}, call_id=f"call-{tag}"))


class Replica:
    """One sandbox process."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log = env, log
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with self.log.open("wb") as sink:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "atmosphere.sandbox", env=self.env, stdout=sink, stderr=sink, cwd=ROOT
            )

        async def probes() -> bool:
            assert self.process is not None
            if self.process.returncode is not None:
                raise AssertionError(f"sandbox exited: {self.log.read_text(errors='replace')[-2000:]}")
            match = re.search(r"probes on http://[\d.]+:(\d+)/readyz", self.log.read_text(errors="replace"))
            if match is None:
                return False
            with contextlib.suppress(httpx.HTTPError):
                async with httpx.AsyncClient() as client:
                    return (await client.get(f"http://127.0.0.1:{match.group(1)}/readyz")).status_code == 200
            return False

        await wait_until(probes, timeout=60, interval=0.1, what="a sandbox replica to be ready")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
            await self.process.wait()


async def drive(url: str, tag: str, frames: list[dict[str, Any]], started: asyncio.Queue[str]) -> None:
    async with websockets.connect(ws_url(url, "replicas"), open_timeout=30) as ws:
        await ws.send(f"Please handle {tag}.")
        while True:
            frame = json.loads(await asyncio.wait_for(ws.recv(), 60))
            frames.append(frame)
            if frame.get("event") == "tool-start":
                started.put_nowait(tag)
            if frame.get("type") in {"complete", "error"} and frame.get("seq", 0) > 0:
                return


def tool_result(frames: list[dict[str, Any]]) -> str:
    [result] = [f for f in frames if f.get("event") in {"tool-result", "tool-error"}]
    return json.dumps(result)


@pytest.mark.timeout(240)
async def test_killing_one_of_two_sandbox_replicas_mid_call_hangs_no_run(
    nats_url: str, bus_namespace: str, nats_bus: NatsBus, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.txt"
    ledger.touch()
    env = {
        **os.environ,
        "ATMOSPHERE_NATS__URL": nats_url,
        "ATMOSPHERE_NATS__NAMESPACE": bus_namespace,
        "ATMOSPHERE_APP": APP,
        "ATMOSPHERE_APP_DIR": str(ROOT),
        "ATMOSPHERE_DATA_DIR": str(tmp_path / "data"),
        "ATMOSPHERE_PROBE_HOST": "127.0.0.1",
        "ATMOSPHERE_PROBE_PORT": "0",
        "PYTHONPATH": str(ROOT),
        LEDGER_ENV: str(ledger),
    }
    provider = ScriptedModel(function=respond)
    async with provider.serving():
        services = service_map(
            nats_url,
            bus_namespace,
            tmp_path / "data",
            ("governance", "memory", "tape", "dispatch", "ingress"),
            app=APP,
            llm_base_url=provider.base_url,
        )
        replicas = [Replica(env, tmp_path / f"sandbox-{i}.log") for i in range(2)]
        async with run_stack(services, bus=nats_bus) as stack:
            url = await stack.ingress_url()
            try:
                await asyncio.gather(*(r.start() for r in replicas))
                frames: dict[str, list[dict[str, Any]]] = {f"run-{i}": [] for i in range(RUNS)}
                started: asyncio.Queue[str] = asyncio.Queue()
                driving = asyncio.gather(*(drive(url, tag, seen, started) for tag, seen in frames.items()))
                for _ in range(RUNS // 2):  # half the calls are in the replicas' hands
                    await asyncio.wait_for(started.get(), 60)
                victim = replicas[0]

                async def victim_holds_a_call() -> bool:
                    # A tool-start frame says dispatch sent the call, not that a replica runs it yet:
                    # on a loaded machine the kill could land before the victim took any.
                    lines = ledger.read_text().splitlines()
                    return any(victim.pid in map(int, line.split()[1:]) for line in lines)

                await wait_until(victim_holds_a_call, timeout=60, what="the victim replica to run a call")
                await victim.kill()
                await asyncio.wait_for(driving, 120)
            finally:
                for replica in replicas:
                    await replica.kill()

    # Every run reached exactly one terminal frame, and it is `complete`: the model was told.
    for tag, seen in frames.items():
        terminals = [f["type"] for f in seen if f.get("type") in {"complete", "error"}]
        assert terminals == ["complete"], (tag, terminals)
    takers: dict[str, set[int]] = defaultdict(set)
    for line in ledger.read_text().splitlines():
        tag, pid, parent = line.split()
        takers[tag].add(victim.pid if victim.pid in (int(pid), int(parent)) else 0)
    hit = [tag for tag, pids in takers.items() if victim.pid in pids]
    assert hit, "the killed replica held no call (it must have: 20 calls over two replicas)"
    for tag in hit:
        result = tool_result(frames[tag])
        if int(tag.split("-")[1]) % 2 == 0:  # idempotent: called once more, on the survivor
            assert f"looked up {tag}" in result, (tag, result)
            assert takers[tag] == {victim.pid, 0}, (tag, takers[tag])
        else:  # not safe to repeat: an error for the model, never a second execution
            assert "tool_timeout" in result, (tag, result)
            assert takers[tag] == {victim.pid}, (tag, takers[tag])
    for tag, pids in takers.items():
        if victim.pid not in pids:
            assert "looked up" in tool_result(frames[tag]) or "noted" in tool_result(frames[tag]), tag
    print(f"\nsandbox replicas: {len(hit)} of {RUNS} calls were on the killed replica; every run completed")
