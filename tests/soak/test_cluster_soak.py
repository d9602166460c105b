"""The soak (`make soak`): a 3-node NATS cluster and two replicas of every service lose a node and
one replica of each service, SIGKILLed during 8 concurrent streaming runs, three rounds over.

The stack is `atmosphere dev --cluster 3 --auth` as a user starts it (each service logged in as
its own NATS user), its model a scripted provider in
this process that streams slowly. Each client streams its run over SSE from one ingress and,
when that stream breaks, resumes it from the other with `Last-Event-ID`. Afterwards every run
must have completed with its whole answer, its stream in `ATMO_EVENTS` must hold every seq from
1 once with the terminal event last in seq order (an event sent again after a node died is
stored behind later ones), the client must have received exactly the client-visible
ones, and the admin reads must give the same answer whichever replica serves them.
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

from atmosphere.bus import NatsBus, connect, subjects
from atmosphere.bus.runs import SERVER_SIDE_KINDS, is_terminal
from atmosphere.cli.dev import DevOptions, wait_for_ready
from atmosphere.cli.dev_layout import SERVICE_REPLICAS_IN_CLUSTER, SERVICES, DevLayout, dev_layout
from atmosphere.contracts.memory.v1.memory_pb2 import LoadHistoryRequest, LoadHistoryResponse
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.testing import ModelRequest, ScriptedModel, Turn, free_port_block, wait_until
from tests.e2e.test_dev_cluster import NODES, SERVICE_PROCESSES, login
from tests.e2e.test_dev_command import alive, descendants, is_tool_worker, start, wait_for_banner

from .soak_app import AGENT

pytestmark = [pytest.mark.soak, pytest.mark.timeout(1800)]

ROUNDS = 3
RUNS_PER_ROUND = 8
WORDS = 60
WORD_DELAY = 0.25
"""An answer streams for ~15 s: every kill of a round lands in the middle of every run."""
ADMIN_TOKEN = "soak-admin-token"
ADMIN_ASKS = 8
"""Each admin read is asked this often through each ingress: requests to a service go to one of
its replicas at random, so 16 asks miss one of two replicas with a chance of 1 in 2**15."""
REWOUND = "ai.run.answer_rewound"
_TAG = re.compile(r"soak-r\d+-c\d+")


def answer_of(tag: str) -> str:
    return " ".join(f"{tag}/w{i}" for i in range(WORDS))


def respond(request: ModelRequest) -> Turn:
    """The model: the answer depends only on the tag in the last user message (a re-asked round gets the same)."""
    user = [m["content"] for m in request["messages"] if m["role"] == "user"]
    return Turn.text(answer_of(_TAG.findall(str(user[-1]))[0]), chunk_delay=WORD_DELAY)


@dataclass
class Client:
    """One streaming run, followed over SSE through whichever ingress answers."""

    tag: str
    ingresses: list[str]
    first: int
    run_id: str = ""
    frames: list[dict[str, Any]] = field(default_factory=list)
    breaks: int = 0
    """Streams that ended without the terminal frame (and were resumed)."""
    submissions: int = 0
    started: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def conversation(self) -> str:
        return f"conv-{self.tag}"

    @property
    def last_seq(self) -> int:
        return int(self.frames[-1]["seq"]) if self.frames else 0

    @property
    def terminal(self) -> dict[str, Any] | None:
        last = self.frames[-1] if self.frames else None
        return last if last and last.get("type") in {"complete", "error"} else None

    def text(self) -> str:
        """The answer as a client shows it: text frames joined, rewinds applied."""
        text = ""
        for frame in self.frames:
            if frame.get("type") == "streaming-text":
                text += str(frame["data"])
            elif frame.get("type") == "metadata" and frame.get("key") == REWOUND:
                text = text[: len(text) - int(frame["value"]["discard"])]
        return text

    async def follow(self, timeout: float) -> None:
        """Submit, then stream to the terminal frame, resuming on the other ingress after each break."""
        deadline = time.monotonic() + timeout
        attempt = 0
        async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=5.0)) as http:
            while self.terminal is None:
                url = self.ingresses[(self.first + attempt) % len(self.ingresses)]
                attempt += 1
                # A broken stream (its ingress killed, a refused resume) is resumed on the other.
                with contextlib.suppress(httpx.HTTPError, OSError, KeyError):
                    await self._stream(http, url)
                if self.terminal is None:
                    self.breaks += 1
                    if time.monotonic() >= deadline:
                        return
                    await asyncio.sleep(0.5)

    async def _stream(self, http: httpx.AsyncClient, url: str) -> None:
        if not self.run_id:
            self.submissions += 1
            headers = {"X-Atmosphere-Conversation-Id": self.conversation, "Content-Type": "text/plain"}
            request = http.stream(
                "POST", f"{url}/atmosphere/agent/{AGENT}", content=f"tell {self.tag}", headers=headers
            )
        else:
            resume = {"Last-Event-ID": str(self.last_seq)}
            request = http.stream("GET", f"{url}/atmosphere/runs/{self.run_id}/events", headers=resume)
        async with request as response:
            if response.status_code != 200:
                return
            self.run_id = self.run_id or response.headers["x-atmosphere-run-id"]
            data: list[str] = []
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    data.append(line[5:].strip())
                elif not line and data:
                    frame = json.loads("\n".join(data))
                    data = []
                    if int(frame.get("seq", 0)) <= 0:
                        continue  # a notice without a seq (e.g. ingress draining): resume
                    self.frames.append(frame)
                    self.started.set()
                    if self.terminal is not None:
                        return


def processes(root: int) -> set[int]:
    return {pid for pid in alive(descendants(root)) if not is_tool_worker(pid)}


def _proc(pid: int, name: str) -> str:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes().replace(b"\0", b" ").decode(errors="replace") + " "
    except OSError:
        return ""


def nats_pid(root: int, node: str) -> int:
    return next(pid for pid in processes(root) if f"--server_name {node} " in _proc(pid, "cmdline"))


def replica_pid(root: int, service: str, data_dir: Path) -> int:
    """The process of `service` whose data directory is `data_dir` (one replica's own)."""
    return next(
        pid
        for pid in processes(root)
        if f"-m atmosphere.{service} " in _proc(pid, "cmdline")
        and f"ATMOSPHERE_DATA_DIR={data_dir} " in _proc(pid, "environ")
    )


async def healed(root: int, layout: DevLayout) -> bool:
    """Every process back, every node healthy, every replica ready."""
    if len(processes(root)) != len(layout.nodes) + len(layout.processes):
        return False
    monitors = {n.name: n.monitor_port for n in layout.nodes}
    ready = {p.name: p.ready_port for p in layout.processes}
    return not await wait_for_ready("127.0.0.1", monitors, 1, path="/healthz") and not await wait_for_ready(
        "127.0.0.1", ready, 1
    )


async def stream_problems(bus: NatsBus, client: Client) -> list[str]:
    """How the run's stream (and what the client got of it) falls short of "every event once, terminal last".

    In seq order: an event sent again after a node died is stored behind later ones (readers
    order by seq, `follow_run`), so the stream's own order is not the run's.
    """
    stored = [
        e async for _, e in bus.replay_sequenced(subjects.EVENTS_STREAM, subjects.run_events(client.run_id), RunEvent)
    ]
    events = sorted(stored, key=lambda e: e.seq)
    seqs = [e.seq for e in events]
    problems: list[str] = []
    if seqs != list(range(1, len(seqs) + 1)):
        problems.append(f"{client.tag}: stream seqs are not 1..n once each: {seqs}")
    if not events or not is_terminal(events[-1]) or sum(1 for e in events if is_terminal(e)) != 1:
        problems.append(f"{client.tag}: the run does not end with its one terminal event")
    visible = [e.seq for e in events if e.WhichOneof("kind") not in SERVER_SIDE_KINDS]
    got = [int(f["seq"]) for f in client.frames]
    if got != visible:
        problems.append(f"{client.tag}: the client got seqs {got}, the stream holds {visible}")
    return problems


async def admin_reads_agree(bus: NatsBus, ingresses: list[str], clients: list[Client]) -> list[str]:
    """Where admin reads disagree across replicas: tape runs, governance decisions, conversation history.

    Each read is asked `ADMIN_ASKS` times through every ingress (tape runs and decisions over the
    admin API, a conversation's history over the bus, as dispatch reads it); requests to a service
    reach one of its replicas at random, so every replica answers some of them. Every answer,
    narrowed to the soak's runs and conversations, must be the same. Returns the disagreements.
    """
    ours = {c.run_id for c in clients}
    answers: dict[str, set[str]] = {}
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(timeout=30, headers=headers) as http:
        for url in ingresses:
            for _ in range(ADMIN_ASKS):
                runs = (await http.get(f"{url}/api/admin/tape/runs", params={"limit": 1000})).json()
                mine = sorted((r["runId"], r["status"]) for r in runs if r["runId"] in ours)
                answers.setdefault("tape runs", set()).add(json.dumps(mine))
                for client in clients:
                    got = await http.get(f"{url}/api/admin/governance/decisions", params={"runId": client.run_id})
                    decisions = sorted((d["decision_id"], d["decision"]) for d in got.json())
                    answers.setdefault(f"decisions of {client.tag}", set()).add(json.dumps(decisions))
    for client in clients:
        for _ in range(ADMIN_ASKS * len(ingresses)):
            request = LoadHistoryRequest(conversation_id=client.conversation, agent=AGENT)
            history = await bus.request(subjects.memory("history.load"), request, LoadHistoryResponse, timeout=10)
            turns = [(m.role, m.content) for m in history.messages]
            answers.setdefault(f"history of {client.tag}", set()).add(json.dumps(turns))
    return [f"{read}: {len(seen)} different answers" for read, seen in answers.items() if len(seen) > 1]


@dataclass
class Figures:
    runs: int = 0
    completed: int = 0
    events: int = 0
    """Client-visible events received, across every run."""
    kills: int = 0
    breaks: int = 0
    resubmissions: int = 0
    rounds: list[float] = field(default_factory=list)


def dev_options(home: Path) -> DevOptions:
    return DevOptions(
        app="tests.soak.soak_app:app",
        home=home,
        cluster=NODES,
        nats_port=free_port_block(NODES),
        nats_cluster_port=free_port_block(NODES),
        nats_monitor_port=free_port_block(NODES),
        http_port=free_port_block(SERVICE_REPLICAS_IN_CLUSTER),
        probe_base_port=free_port_block(SERVICE_PROCESSES),
        grpc_port=free_port_block(SERVICE_REPLICAS_IN_CLUSTER),
        auth=True,
    )


def dev_argv(options: DevOptions) -> list[str]:
    return [
        str(Path(sys.executable).parent / "atmosphere"),
        "dev",
        "--app",
        options.app,
        "--home",
        str(options.home),
        "--cluster",
        str(options.cluster),
        "--nats-port",
        str(options.nats_port),
        "--nats-cluster-port",
        str(options.nats_cluster_port),
        "--nats-monitor-port",
        str(options.nats_monitor_port),
        "--http-port",
        str(options.http_port),
        "--probe-base-port",
        str(options.probe_base_port),
        "--grpc-port",
        str(options.grpc_port),
        "--no-model",
        "--auth",
    ]


async def test_the_cluster_loses_nothing_when_a_node_and_a_replica_of_each_service_die(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    began = time.monotonic()
    figures = Figures()
    problems: list[str] = []
    provider = ScriptedModel(function=respond)
    async with provider.serving():
        monkeypatch.setenv("LLM_BASE_URL", provider.base_url)
        monkeypatch.setenv("LLM_MODEL", "fake-model")
        monkeypatch.setenv("ATMOSPHERE_ADMIN_TOKEN", ADMIN_TOKEN)
        options = dev_options(tmp_path / "home")
        layout = dev_layout(options)
        ingresses = [f"http://127.0.0.1:{p.http_port}" for p in layout.of("ingress")]
        with start(dev_argv(options), tmp_path) as (process, output):
            await wait_for_banner(output, timeout=600)
            started = time.monotonic() - began
            clients: list[Client] = []
            # The checks read streams and ask memory as dispatch does: every service has its own login.
            urls = layout.nats_url("127.0.0.1").split(",")
            async with connect(urls, name="soak", **login(options.home, "dispatch")) as bus:
                for round_no in range(ROUNDS):
                    round_began = time.monotonic()
                    batch = [
                        Client(f"soak-r{round_no}-c{i}", ingresses, first=i % len(ingresses))
                        for i in range(RUNS_PER_ROUND)
                    ]
                    followers = [asyncio.create_task(c.follow(timeout=240)) for c in batch]
                    await asyncio.wait_for(asyncio.gather(*(c.started.wait() for c in batch)), 120)
                    # Mid-stream: one node, and one replica of every service (alternating which).
                    victims = [nats_pid(process.pid, layout.nodes[round_no % len(layout.nodes)].name)]
                    replica = round_no % 2
                    victims += [replica_pid(process.pid, s, layout.of(s)[replica].data_dir) for s in SERVICES]
                    for pid in victims:
                        os.kill(pid, signal.SIGKILL)
                    figures.kills += len(victims)
                    await asyncio.gather(*followers)
                    await wait_until(
                        lambda: healed(process.pid, layout), timeout=180, interval=1, what="the stack to heal"
                    )
                    figures.rounds.append(time.monotonic() - round_began)
                    clients += batch
                for client in clients:
                    figures.runs += 1
                    figures.events += len(client.frames)
                    figures.breaks += client.breaks
                    figures.resubmissions += client.submissions - 1
                    terminal = client.terminal
                    if terminal is None or terminal["type"] != "complete":
                        problems.append(f"{client.tag}: ended with {terminal} after {client.breaks} breaks")
                        continue
                    if client.text() != answer_of(client.tag):
                        problems.append(f"{client.tag}: the answer differs: {client.text()!r}")
                        continue
                    figures.completed += 1
                    problems += await stream_problems(bus, client)
                problems += [f"{c.tag}: submitted {c.submissions} times" for c in clients if c.submissions != 1]
                problems += await admin_reads_agree(bus, ingresses, clients)
            os.killpg(process.pid, signal.SIGINT)
            assert process.wait(120) == 0, output.read()[-5000:]
    print(
        f"\nsoak: {figures.runs} runs ({figures.completed} complete, {figures.runs - figures.completed} lost), "
        f"{figures.events} events received, {figures.kills} kills (SIGKILL) in {ROUNDS} rounds, "
        f"{figures.breaks} client streams resumed, {figures.resubmissions} resubmissions; "
        f"stack up in {started:.0f} s, rounds {', '.join(f'{r:.0f} s' for r in figures.rounds)}; "
        f"wall time {time.monotonic() - began:.0f} s"
    )
    for problem in problems:
        print(f"  {problem[:400]}")
    assert problems == []
