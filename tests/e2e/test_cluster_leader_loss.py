"""A 3-node cluster loses the node that leads a stream (frozen 20 s, or killed) during 20 runs.

The six services run (each through its real `serve()`) on a real 3-node nats-server cluster with
every stream at three replicas; 20 clients each stream a run over SSE and, when a stream breaks,
resume it by `Last-Event-ID`. Mid-run, the node leading `ATMO_EVENTS` (or `ATMO_RUNS`) is
SIGSTOPped for 20 s, or SIGKILLed and started again. Afterwards every accepted run must be whole:
its events in `ATMO_EVENTS` are seq 1..N exactly once with one terminal event, the last (or the
run ended with one clear error), every client got exactly one terminal frame, no follower hung,
and no client saw an exception's class name.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from atmosphere.bus import BusError, NatsBus, connect, subjects
from atmosphere.bus.runs import ANSWER_REWOUND_METADATA_KEY, STORE_DEADLINE, is_terminal
from atmosphere.config import JetStreamSettings
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.dispatch.settings import DispatchOptions
from atmosphere.testing import ModelRequest, ScriptedModel, Turn, run_stack, wait_until
from atmosphere.testing.nats_server import NatsCluster

from .conftest import service_map

pytestmark = pytest.mark.timeout(420)

RUNS = 20
WORDS = 40
WORD_DELAY = 0.25
"""An answer streams for ~10 s, all 20 at once: the node is lost in the middle of every run."""
FREEZE = 20.0
CLIENT_DEADLINE = 180.0
"""Seconds a client keeps resuming its run before it counts as a follower that hung."""
_TAG = re.compile(r"run-\d+")
_EXCEPTION_NAME = re.compile(r"\b[A-Z][A-Za-z]+(Error|Exception)\b")


def answer_of(tag: str) -> str:
    return " ".join(f"{tag}/w{i}" for i in range(WORDS))


def respond(request: ModelRequest) -> Turn:
    """A model whose answer depends only on the tag asked about (a re-asked round says the same)."""
    user = [m["content"] for m in request["messages"] if m["role"] == "user"]
    return Turn.text(answer_of(_TAG.findall(str(user[-1]))[0]), chunk_delay=WORD_DELAY)


@dataclass
class Client:
    """One run streamed over SSE, resumed after every break."""

    tag: str
    url: str
    run_id: str = ""
    frames: list[dict[str, Any]] = field(default_factory=list)
    breaks: int = 0
    refused: str = ""
    """Why the run was never accepted (no run id), if it was not."""

    @property
    def terminals(self) -> list[dict[str, Any]]:
        return [f for f in self.frames if f.get("type") in {"complete", "error"}]

    @property
    def text(self) -> str:
        """The answer as a client that applies `ai.run.answer_rewound` shows it."""
        answer = ""
        for frame in self.frames:
            if frame.get("type") == "streaming-text":
                answer += str(frame.get("data", ""))
            elif frame.get("type") == "metadata" and frame.get("key") == ANSWER_REWOUND_METADATA_KEY:
                answer = answer[: max(0, len(answer) - int(frame["value"]["discard"]))]
        return answer

    async def stream(self) -> None:
        deadline = time.monotonic() + CLIENT_DEADLINE
        async with httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(10, read=30)) as http:
            while not self.terminals and time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError, json.JSONDecodeError):
                    await self._read(http)
                if not self.terminals:
                    self.breaks += 1
                    if not self.run_id and self.refused:
                        return
                    await asyncio.sleep(0.5)

    async def _read(self, http: httpx.AsyncClient) -> None:
        if not self.run_id:
            request = http.build_request("POST", "/atmosphere/agent/assistant", content=f"Tell me about {self.tag}")
        else:
            last = max((f.get("seq", 0) for f in self.frames), default=0)
            request = http.build_request(
                "GET", f"/atmosphere/runs/{self.run_id}/events", headers={"Last-Event-ID": str(last)}
            )
        response = await http.send(request, stream=True)
        try:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                self.frames.append({"type": "http", "status": response.status_code, "body": body})
                if not self.run_id and response.status_code in {413, 503}:
                    self.refused = body
                return
            self.run_id = self.run_id or response.headers.get("x-atmosphere-run-id", "")
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                frame = json.loads(line[len("data: ") :])
                if frame.get("type") == "error" and "seq" not in frame:
                    self.frames.append({**frame, "type": "broke"})  # the stream broke: resume it
                    return
                self.frames.append(frame)
                if frame.get("type") in {"complete", "error"}:
                    return
        finally:
            await response.aclose()


async def stored(bus: NatsBus, run_id: str) -> list[RunEvent]:
    """Every copy `ATMO_EVENTS` holds of the run's events, in stream order (duplicates kept).

    Read again while the cluster still settles (JetStream answers "temporarily unavailable").
    """
    deadline = time.monotonic() + 60
    while True:
        try:
            return [e async for e in bus.replay(subjects.EVENTS_STREAM, subjects.run_events(run_id), RunEvent)]
        except BusError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1)


async def settled(bus: NatsBus, run_id: str, deadline: float) -> list[RunEvent]:
    """The run's stored events once its writer is done: a terminal and every seq before it stored,
    or `deadline` past.

    A client may see an event before it is stored: subscribers get it as it is published, and a
    publish the lost leader swallowed is stored by the writer's retry, up to `STORE_DEADLINE` —
    behind later events, the terminal among them (the writer repairs what its terminal's
    acknowledgement could not prove, after it; readers order by seq and fill gaps late).
    """
    while True:
        events = await stored(bus, run_id)
        seqs = {e.seq for e in events}
        whole = any(is_terminal(e) for e in events) and seqs == set(range(1, max(seqs) + 1))
        if whole or time.monotonic() > deadline:
            return events
        await asyncio.sleep(1)


async def leader_of(bus: NatsBus, stream: str) -> str:
    leader = await bus.stream_leader(stream)
    return leader.split("@", 1)[0]


@contextlib.asynccontextmanager
async def cluster_stack(
    cluster: NatsCluster, namespace: str, data: Path, provider: ScriptedModel
) -> AsyncIterator[tuple[NatsBus, str]]:
    services = service_map(
        cluster.url,
        namespace,
        data,
        app="examples.assistant:app",
        llm_base_url=provider.base_url,
        dispatch={
            "dispatch": DispatchOptions(
                grpc_host="127.0.0.1", grpc_port=0, runtime="built-in", max_concurrent_runs=RUNS
            )
        },
    )
    replicated = JetStreamSettings(replicas=3)
    services = {name: (serve, s.model_copy(update={"jetstream": replicated})) for name, (serve, s) in services.items()}
    async with (
        connect(cluster.urls, name="leader-loss-test", namespace=namespace) as bus,
        run_stack(services, bus=bus) as stack,
    ):
        yield bus, await stack.ingress_url()


@pytest.mark.parametrize("stream", [subjects.EVENTS_STREAM, subjects.RUNS_STREAM])
@pytest.mark.parametrize("how", ["freeze", "kill"])
async def test_losing_a_streams_leader_corrupts_no_accepted_run(
    how: str, stream: str, nats_cluster: NatsCluster, bus_namespace: str, tmp_path: Path
) -> None:
    provider = ScriptedModel(function=respond)
    async with (
        provider.serving(),
        cluster_stack(nats_cluster, bus_namespace, tmp_path / "data", provider) as (bus, url),
    ):
        clients = [Client(f"run-{i}", url) for i in range(RUNS)]
        streaming = [asyncio.create_task(c.stream()) for c in clients]
        await wait_until(_streaming(clients), timeout=60, what="every run to stream its answer")
        victim = nats_cluster.index_of(await leader_of(bus, stream))
        pid = nats_cluster.pid(victim)
        if how == "freeze":
            os.kill(pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(FREEZE)
            finally:
                os.kill(pid, signal.SIGCONT)
        else:
            nats_cluster.kill(victim)
            await asyncio.sleep(3)
            await asyncio.to_thread(nats_cluster.start, victim)
        await asyncio.wait_for(asyncio.gather(*streaming), CLIENT_DEADLINE + 30)
        # Every writer has stored its run's events, or given up, by then (they all started before).
        settle_by = time.monotonic() + STORE_DEADLINE + 5
        report = [await _check(bus, client, settle_by) for client in clients]
    problems = [line for lines in report for line in lines]
    assert not problems, "\n".join(problems)


def _streaming(clients: list[Client]) -> Any:
    async def condition() -> bool:
        return all(any(f.get("type") == "streaming-text" for f in c.frames) for c in clients)

    return condition


async def _check(bus: NatsBus, client: Client, settle_by: float) -> list[str]:
    """What is wrong with one client's run (nothing, if all is well)."""
    problems: list[str] = []
    name = f"{client.tag} ({client.run_id or 'never accepted'})"
    for frame in client.frames:
        if found := _EXCEPTION_NAME.search(json.dumps(frame)):
            problems.append(f"{name}: a client saw {found[0]!r}: {frame}")
    if not client.run_id:
        return problems
    if len(client.terminals) != 1:
        problems.append(f"{name}: {len(client.terminals)} terminal frames after {client.breaks} resumes")
    elif client.terminals[0]["type"] == "complete" and client.text != answer_of(client.tag):
        problems.append(f"{name}: completed with the answer {client.text!r}")
    try:
        events = await settled(bus, client.run_id, settle_by)
    except BusError as exc:
        return [*problems, f"{name}: its events cannot be read: {exc}"]
    seqs = Counter(e.seq for e in events)
    twice = sorted(s for s, n in seqs.items() if n > 1)
    missing = sorted(set(range(1, max(seqs, default=0) + 1)) - set(seqs))
    terminals = [e.seq for e in events if is_terminal(e)]
    if twice:
        problems.append(f"{name}: seqs stored more than once: {twice}")
    if missing:
        problems.append(f"{name}: seqs missing from the stream: {missing}")
    if len(terminals) != 1 or terminals[0] != max(seqs, default=0):
        problems.append(f"{name}: terminal events at seqs {terminals} of 1..{max(seqs, default=0)}")
    if problems:
        tail = [{k: v for k, v in f.items() if k != "sessionId"} for f in client.frames[-4:]]
        problems.append(f"{name}: the client resumed {client.breaks} times and got last {tail}")
    return problems
