"""Durable runs off (the default): a dispatch killed or frozen inside a tool call never has it run twice.

Two dispatch processes take turns: the run is taken by the only one up, its tool records its
effect in a ledger and holds; the other one is started, then the holder is killed with SIGKILL
(ten times) or frozen with SIGSTOP and woken after its run was taken over. Every tool must run
at most once, every client stream end with exactly one terminal frame (`dispatch.run_interrupted`,
naming the call), and the take-over come within seconds — as fast as with durable runs.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from atmosphere.bus import NatsBus, subjects
from atmosphere.bus.errors import RunInterruptedError
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.testing import ModelRequest, ScriptedModel, ToolCallScript, Turn, run_stack, wait_until

from .apps.takeover_app import LEDGER_ENV, release_file
from .conftest import service_map
from .test_chaos import Client, Worker, drive, worker_env

APP = "tests.e2e.apps.takeover_app:app"
KILLS = 10
MAX_TAKEOVER = 5.0
_TAG = re.compile(r"run-\d+")


def respond(request: ModelRequest) -> Turn:
    """The model: round 0 calls the tool; after it, a short answer (never reached when killed)."""
    messages = request["messages"]
    tag = _TAG.findall(next(m["content"] for m in messages if m["role"] == "user"))[0]
    if messages[-1]["role"] == "tool":
        return Turn.text(f"Recorded {tag}.")
    return Turn.tool_calls(
        ToolCallScript("record_effect", {"tag": tag}, call_id=f"call-{tag}"), text=f"Recording {tag}. "
    )


class Takeover:
    """The stack (in-process services, two dispatch processes) and the test's view of it."""

    def __init__(self, url: str, bus: NatsBus, workers: list[Worker], ledger: Path, provider: ScriptedModel) -> None:
        self.url, self.bus, self.workers, self.ledger, self.provider = url, bus, workers, ledger, provider

    def effects(self) -> Counter[str]:
        return Counter(self.ledger.read_text().split())

    def asked(self, tag: str) -> int:
        """How many times the model was asked anything for `tag`'s run."""
        return sum(1 for r in self.provider.requests if tag in str(r["messages"]))

    async def until_effect(self, tag: str) -> None:
        async def recorded() -> bool:
            return self.effects()[tag] >= 1

        await wait_until(recorded, timeout=60, what=f"{tag}'s tool to record its effect")

    async def stored(self, run_id: str) -> list[RunEvent]:
        events = self.bus.replay(subjects.EVENTS_STREAM, subjects.run_events(run_id), RunEvent)
        return sorted([e async for e in events], key=lambda e: e.seq)


@pytest.fixture
async def takeover(nats_url: str, bus_namespace: str, nats_bus: NatsBus, tmp_path: Path) -> AsyncIterator[Takeover]:
    ledger = tmp_path / "ledger.txt"
    ledger.touch()
    os.environ[LEDGER_ENV] = str(ledger)  # the sandbox runs in this process
    provider = ScriptedModel(function=respond)
    async with provider.serving():
        services = service_map(
            nats_url, bus_namespace, tmp_path / "data", ("governance", "memory", "tape", "sandbox", "ingress"), app=APP
        )
        # Durable runs off: the default, said out loud.
        env = worker_env(
            nats_url, bus_namespace, tmp_path / "data", app=APP, provider_url=provider.base_url, durable=False
        )
        workers = [Worker(env, tmp_path), Worker(env, tmp_path)]
        async with run_stack(services, bus=nats_bus) as stack:
            try:
                await workers[0].start()
                yield Takeover(await stack.ingress_url(), nats_bus, workers, ledger, provider)
            finally:
                for worker in workers:
                    await worker.stop()


def assert_ended_interrupted(client: Client) -> None:
    """One terminal frame, last: the run's interruption, naming the call that may have run."""
    terminals = [f for _, f in client.frames if f.get("type") in {"complete", "error"}]
    assert len(terminals) == 1, (client.tag, terminals)
    assert client.frames[-1][1] is terminals[0], client.tag  # nothing after it
    [error] = terminals
    assert error["code"] == RunInterruptedError.code, (client.tag, error)
    assert f"record_effect (call call-{client.tag}, may or may not have taken effect)" in error["data"], error
    seqs = [f["seq"] for _, f in client.frames]
    assert seqs == sorted(set(seqs)), client.tag


async def assert_stored_once(takeover: Takeover, client: Client) -> None:
    """The run's stream itself: each seq once, one terminal event, the newest."""
    stored = await takeover.stored(client.run_id)
    seqs = [e.seq for e in stored]
    assert seqs == sorted(set(seqs)), (client.tag, seqs)
    terminal = [e.seq for e in stored if e.WhichOneof("kind") in {"complete", "error"}]
    assert terminal == [seqs[-1]], (client.tag, terminal, seqs)


@pytest.mark.timeout(420)
async def test_killing_the_worker_inside_a_tool_call_never_runs_it_twice(takeover: Takeover) -> None:
    clients = [Client(f"run-{i}") for i in range(KILLS)]
    delays: list[float] = []
    for index, client in enumerate(clients):
        holder, spare = takeover.workers[index % 2], takeover.workers[(index + 1) % 2]
        driving = asyncio.create_task(drive(takeover.url, client))  # taken by the only worker up
        await takeover.until_effect(client.tag)
        await spare.start()  # the tool holds meanwhile: the kill lands inside it
        holder.kill()
        killed_at = time.monotonic()
        assert holder.process is not None
        await holder.process.wait()
        release_file(takeover.ledger, client.tag).touch()  # a call made again would not hold
        await asyncio.wait_for(driving, 60)
        delays.append(next(t for t, _ in client.frames if t > killed_at) - killed_at)

    effects = takeover.effects()
    print(
        f"\ndefault-mode takeover: {KILLS} kills inside a tool call; takeover p50 {statistics.median(delays):.2f}s"
        f" max {max(delays):.2f}s ({', '.join(f'{d:.2f}' for d in delays)}); tool runs per run"
        f" {sorted(Counter(effects.values()).items())}"
    )
    for client in clients:
        assert effects[client.tag] == 1, (client.tag, effects)  # ran once, never again
        assert takeover.asked(client.tag) == 1  # the model was not asked to choose its calls anew
        assert_ended_interrupted(client)
        await assert_stored_once(takeover, client)
    assert max(delays) <= MAX_TAKEOVER, delays


@pytest.mark.timeout(180)
async def test_a_frozen_worker_whose_run_was_taken_over_writes_and_calls_nothing_when_it_wakes(
    takeover: Takeover, tmp_path: Path
) -> None:
    holder, spare = takeover.workers
    client = Client("run-0")
    driving = asyncio.create_task(drive(takeover.url, client))
    await takeover.until_effect(client.tag)
    await spare.start()
    assert holder.process is not None
    holder.process.send_signal(signal.SIGSTOP)  # a stall past the ack wait: its run goes to the spare
    try:
        await asyncio.wait_for(driving, 60)
    finally:
        holder.process.send_signal(signal.SIGCONT)
    assert_ended_interrupted(client)
    # Woken, the holder gets its tool's answer and would report it, then ask the model again.
    release_file(takeover.ledger, client.tag).touch()

    async def fenced() -> bool:
        logs = "".join(p.read_text(errors="replace") for p in tmp_path.glob("dispatch-*.log"))
        return "another worker took the run" in logs

    await wait_until(fenced, timeout=20, what="the woken holder to learn its run was taken over")
    await asyncio.sleep(1.0)  # whatever it would still write has had time to arrive
    await assert_stored_once(takeover, client)
    assert takeover.effects()[client.tag] == 1
    assert takeover.asked(client.tag) == 1
