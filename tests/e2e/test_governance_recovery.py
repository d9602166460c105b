"""Governance comes back in seconds: both replicas SIGKILLed for 20 s under load, then started again.

Governance runs as two real processes (`python -m atmosphere.governance`, a data directory each),
killed with SIGKILL while clients keep starting runs over WebSocket; the rest of the stack runs
through its real `serve()` on the same nats-server, the model is the fake provider. Each run
calls a tool and streams a two-second answer, so every governance check is on its path (admission,
the tool check, the tool output's screen, the answer's check, the run's end).

While governance is down every run is refused, fail-closed, with `governance.unavailable` (none
completes unchecked). Once both replicas are ready again, the run a client starts 5 s later
succeeds, in its own time: nothing lingers from the outage. Runs started during the outage used
to hold a dispatch slot for the whole governance timeout each, so the run queue backed up behind
them and the first runs after the outage waited out that backlog.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from atmosphere.bus import NatsBus
from atmosphere.testing import ModelRequest, ScriptedModel, ToolCallScript, Turn, run_stack, wait_until

from .conftest import ROOT, service_map
from .wsclient import ws_url

OUTAGE = 20.0
RECOVERY = 5.0
"""The deliverable: a run started this long after governance is ready again succeeds."""
RUNS_PER_SECOND = 6.0
ANSWER_WORDS = 20
WORD_DELAY = 0.1
"""The answer streams for two seconds: a run holds its dispatch slot that long when it succeeds."""
POLICIES = """\
policies:
  - {name: no-deletes, type: deny-list, config: {regex: ["^call_tool:delete_"]}}
  - {name: no-pii, type: pii-redaction, config: {mode: redact}}
"""
APP = "tests.e2e.apps.governed_app:app"


def respond(request: ModelRequest) -> Turn:
    """Round one asks for a tool; after it, a two-second answer."""
    if request["messages"][-1]["role"] == "tool":
        return Turn.text(" ".join(f"w{i}" for i in range(ANSWER_WORDS)), chunk_delay=WORD_DELAY)
    return Turn.tool_calls(ToolCallScript("read_record", {"record_id": "7"}))


@dataclass
class Governance:
    """One governance replica as a process of its own: started, SIGKILLed, started again on its data."""

    env: dict[str, str]
    log: Path
    process: asyncio.subprocess.Process | None = None
    starts: int = 0

    async def start(self) -> None:
        self.starts += 1
        with self.log.open("ab") as sink:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "atmosphere.governance", env=self.env, stdout=sink, stderr=sink, cwd=ROOT
            )

    async def ready(self, http: httpx.AsyncClient) -> bool:
        """Whether this start's `/readyz` says ready (its responders are subscribed)."""
        assert self.process is not None
        if self.process.returncode is not None:
            raise AssertionError(f"governance exited: {self.log.read_text(errors='replace')[-3000:]}")
        ports = re.findall(r"probes on http://[\d.]+:(\d+)/readyz", self.log.read_text(errors="replace"))
        if len(ports) < self.starts:
            return False
        with contextlib.suppress(httpx.HTTPError):
            return (await http.get(f"http://127.0.0.1:{ports[-1]}/readyz")).status_code == 200
        return False

    async def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
            await self.process.wait()


@dataclass
class Outcome:
    started: float
    ended: float
    terminal: dict[str, Any]

    @property
    def ok(self) -> bool:
        return self.terminal.get("type") == "complete"


@dataclass
class Clients:
    """Starts a run every `1 / RUNS_PER_SECOND` seconds, each on its own WebSocket, whatever the others do."""

    url: str
    outcomes: list[Outcome] = field(default_factory=list)
    running: set[asyncio.Task[Outcome]] = field(default_factory=set)

    async def run(self) -> Outcome:
        started = time.monotonic()
        terminal: dict[str, Any] = {}
        async with websockets.connect(ws_url(self.url, "records"), open_timeout=30) as ws:
            await ws.send("Read record 7")
            while not terminal:
                frame = json.loads(await asyncio.wait_for(ws.recv(), 120))
                if frame.get("type") in {"complete", "error"} and frame.get("seq", 0) > 0:
                    terminal = frame
        outcome = Outcome(started, time.monotonic(), terminal)
        self.outcomes.append(outcome)
        return outcome

    def start(self) -> asyncio.Task[Outcome]:
        task = asyncio.create_task(self.run())
        self.running.add(task)
        task.add_done_callback(self.running.discard)
        return task

    async def keep_starting(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.start()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1 / RUNS_PER_SECOND)

    async def finish(self) -> None:
        await asyncio.gather(*self.running)


def governance_env(nats_url: str, namespace: str, data_dir: Path, policies: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ATMOSPHERE_NATS__URL": nats_url,
        "ATMOSPHERE_NATS__NAMESPACE": namespace,
        "ATMOSPHERE_DATA_DIR": str(data_dir),
        "ATMOSPHERE_PROBE_HOST": "127.0.0.1",
        "ATMOSPHERE_PROBE_PORT": "0",
        "ATMOSPHERE_GOVERNANCE__POLICY_FILES": json.dumps([str(policies)]),
        "PYTHONPATH": str(ROOT),
    }


async def all_ready(replicas: list[Governance], http: httpx.AsyncClient) -> bool:
    return all([await r.ready(http) for r in replicas])


@pytest.mark.timeout(240)
async def test_both_governance_replicas_killed_for_20_s_then_back_the_next_runs_succeed_within_seconds(
    nats_url: str, bus_namespace: str, nats_bus: NatsBus, tmp_path: Path
) -> None:
    policies = tmp_path / "policies.yaml"
    policies.write_text(POLICIES)
    replicas = [
        Governance(governance_env(nats_url, bus_namespace, tmp_path / name, policies), tmp_path / f"{name}.log")
        for name in ("governance-a", "governance-b")
    ]
    provider = ScriptedModel(function=respond)
    async with provider.serving(), httpx.AsyncClient() as http:
        services = service_map(
            nats_url,
            bus_namespace,
            tmp_path / "data",
            ("memory", "tape", "sandbox", "dispatch", "ingress"),
            app=APP,
            llm_base_url=provider.base_url,
        )
        try:
            for replica in replicas:
                await replica.start()
            await wait_until(lambda: all_ready(replicas, http), timeout=60, interval=0.1, what="governance")
            async with run_stack(services, bus=nats_bus) as stack:
                clients = Clients(await stack.ingress_url())
                before = await clients.start()
                assert before.ok  # governed end to end before the outage
                stop = asyncio.Event()
                load = asyncio.create_task(clients.keep_starting(stop))
                await asyncio.sleep(3)

                for replica in replicas:
                    await replica.kill()
                killed = time.monotonic()
                await asyncio.sleep(OUTAGE)
                for replica in replicas:
                    await replica.start()
                await wait_until(lambda: all_ready(replicas, http), timeout=60, interval=0.05, what="governance back")
                ready = time.monotonic()

                await asyncio.sleep(RECOVERY)
                probe = await asyncio.wait_for(clients.start(), 60)
                stop.set()
                await load
                await clients.finish()
        finally:
            for replica in replicas:
                await replica.kill()

    after = sorted((o for o in clients.outcomes if o.started >= ready), key=lambda o: o.started)
    first_success = next((o.ended - ready for o in after if o.ok), float("inf"))
    during = [o for o in clients.outcomes if killed + 1 < o.started and o.ended < ready]
    print(
        f"\ngovernance back: the first run started after it was ready succeeded +{first_success:.1f}s after;"
        f" the run started at +{RECOVERY:g}s took {probe.ended - probe.started:.1f}s ({probe.terminal.get('type')});"
        f" {len(during)} runs refused during the outage"
    )
    # While governance was down (after what was in flight at the kill), every run was refused.
    assert during
    assert {o.terminal.get("code") for o in during} == {"governance.unavailable"}, [o.terminal for o in during[:3]]
    # Back: the run started 5 s after governance was ready succeeded, in about its own time: what
    # the same run took before the outage (on this machine, under this load), give or take 5 s.
    assert probe.ok, probe.terminal
    own_time = before.ended - before.started
    assert probe.ended - probe.started < own_time + RECOVERY, (probe.ended - probe.started, own_time)
