"""What ingress adds between a client and the model, beside the LiteLLM proxy in front of the same upstream.

Four arms stream from one fake OpenAI-compatible upstream (`atmosphere.testing.model_server`)
whose tokens carry their send time in ns, so each token's latency is measured end to end on
one clock:

  upstream directly           client → upstream
  OpenAI endpoint (ingress)   client → ingress `POST /atmosphere/v1/chat/completions` (SSE) → NATS
                              → dispatch → upstream, frames back over NATS
  WebSocket (ingress)         the same run through `ws://…/atmosphere/agent/assistant`: a socket
                              per stream (a socket is a conversation, as an OpenAI request is)
  LiteLLM proxy               client → `litellm --num_workers 1` → upstream

The system under test runs as real processes: nats-server, governance, tape, memory (every run
loads and records its history there), dispatch and ingress with `examples.assistant:app`.
LiteLLM is installed by this script into its own venv (`.atmosphere/bench/litellm-venv`, pinned
below) and runs offline (local model-cost map, no database, no callbacks, no telemetry). Both
stacks run without auth (LiteLLM needs `LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY` for
that; it listens on loopback only).

Each stream is 10 tokens 10 ms apart (a fast model; the first comes after 20 ms). For each
concurrency (1, 16, 64) the arms run in interleaved rounds in shuffled order; the first round
warms up and is discarded. In a round each arm streams a block of max(streams, 2 x concurrency)
completions (at concurrency 1: streams) from as many clients as the concurrency, each starting its
next stream when one ends; the clients start spread over one stream's length, so at 64 the block is 64 streams in
flight rather than one burst of 64 requests. The HTTP arms use a lean keep-alive HTTP/1.1 client
(httptools): with httpx the load CPU saturated at 16 streams. Per stream: time to first token
(TTFT) from the request's start (for a WebSocket: the prompt, after the handshake) to the first
token, and each token's latency (receive time minus the time in the token); a stream that errs, or
does not deliver every token, counts as failed.

Added = per-round difference (arm minus direct) of p50 and p99; the report is the median over
rounds. CPU per token is the user+system time (`/proc/<pid>/stat`) of the arm's server processes
over its blocks (ours: ingress, dispatch, tape, governance, memory, nats-server; LiteLLM: its
process tree) divided by the tokens delivered, so it includes each request's own cost spread over
its 10 tokens; ours is also split by process. Our arms' added latency and CPU are also given as a
ratio to LiteLLM's. "load" is the busiest block's CPU of the load generator plus the upstream,
"server" the same for the arm's servers, in % of one core: near 100 % the CPU, not the path, sets
the latency (queueing); near 100 % load, the load side does.

Idle WebSockets: before the rounds, 10,000 sockets are opened to the agent endpoint and left
idle; the ingress process's PSS (`/proc/<pid>/smaps_rollup`) before and after, divided by 10,000.

Targets (the performance issue), for both ingress arms: added TTFT p50 <= 10 ms at 1 and 16
streams and <= 50 ms at 64; at 64 streams added TTFT p99 <= 1/10 of LiteLLM's and CPU per token
<= 1/4 of LiteLLM's; at one stream CPU per token below LiteLLM's; an idle WebSocket <= 24 KiB at
10,000 connections. A failed target prints FAIL and still exits 0; the exit status is 1 only
when streams failed directly or through ingress (LiteLLM's failures are reported, with its log).

With two or more CPUs the system under test (ours or LiteLLM, every thread) is pinned to CPU 0
and the load generator (this process) and the fake upstream to CPU 1 (`--no-pin` turns that off).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httptools
import httpx
import websockets
from websockets.protocol import State

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cpu import cpu_seconds, per_token_line, tree

from atmosphere.service import loop_factory
from atmosphere.testing import NatsServer, free_port

ROOT = Path(__file__).resolve().parent.parent
SUT_CPUS: set[int] = set()
LOAD_CPUS: set[int] = set()

# LiteLLM 1.82.7 and 1.82.8 on PyPI were a supply-chain compromise (a credential stealer, since
# withdrawn). 1.107.0 final is missing from PyPI as well (only its release candidates are listed)
# and a PyPI audit tool describes it as compromised too. 1.106.12 (2026-11-20) is the last patch of
# a line maintained for a month, outside both: bump it deliberately, never into those versions.
LITELLM_VERSION = "1.106.12"
LITELLM_VENV = ROOT / ".atmosphere" / "bench" / "litellm-venv"

TOKENS = 10
TOKEN_GAP = 0.01
"""Seconds between the upstream's chunks (100 tokens/s per stream)."""
CONCURRENCY = (1, 16, 64)
IDLE_SOCKETS = 10_000
SETTLE = 0.2
"""Seconds after each block before the servers' CPU is read (the tape writes a little behind)."""
STREAM_TIMEOUT = 60.0
PROMPT = {"stream": True, "messages": [{"role": "user", "content": "go"}]}

DIRECT, OPENAI, WEBSOCKET, LITELLM = (
    "upstream directly",
    "OpenAI endpoint (ingress)",
    "WebSocket (ingress)",
    "LiteLLM proxy",
)


# -- processes and /proc -------------------------------------------------------------------------


def pin(pid: int, cpus: set[int]) -> None:
    """Pin every thread of `pid` and its descendants (threads started later inherit it)."""
    if not cpus:
        return
    for process in tree(pid):
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{process}/task"):
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(task), cpus)


def memory_kib(pid: int) -> int:
    """Proportional set size (PSS) of one process, or its RSS without smaps_rollup."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no memory figure for {pid}")


def stop_all(children: list[subprocess.Popen[bytes]]) -> None:
    for child in children:
        if child.poll() is None:
            child.terminate()
    for child in children:
        try:
            child.wait(15)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(5)


@contextlib.contextmanager
def fake_upstream() -> Iterator[tuple[str, int]]:
    """The scripted provider in a process of its own, on the load generator's CPU."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "atmosphere.testing.model_server",
            "--port",
            str(port),
            "--tokens",
            str(TOKENS),
            "--chunk-delay",
            str(TOKEN_GAP),
            "--timestamps",
        ]
    )
    pin(process.pid, LOAD_CPUS)
    try:
        yield f"http://127.0.0.1:{port}/v1", process.pid
    finally:
        stop_all([process])


@contextlib.contextmanager
def our_services(nats_url: str, upstream: str, data: Path, http_port: int) -> Iterator[dict[str, int]]:
    env = {
        **os.environ,
        "ATMOSPHERE_NATS__URL": nats_url,
        "ATMOSPHERE_DATA_DIR": str(data),
        "ATMOSPHERE_APP": "examples.assistant:app",
        "ATMOSPHERE_APP_DIR": str(ROOT),
        "ATMOSPHERE_LOG__LEVEL": "WARNING",
        "ATMOSPHERE_PROBE_PORT": "0",
        "LLM_BASE_URL": upstream,
        "LLM_MODEL": "fake-model",
        "ATMOSPHERE_DISPATCH__MAX_CONCURRENT_RUNS": "128",
        # The built-in runtime's figures, whichever framework adapters are installed beside it.
        "ATMOSPHERE_DISPATCH__RUNTIME": "built-in",
        "ATMOSPHERE_DISPATCH__GRPC_HOST": "127.0.0.1",
        "ATMOSPHERE_DISPATCH__GRPC_PORT": str(free_port()),
        "ATMOSPHERE_INGRESS__HOST": "127.0.0.1",
        "ATMOSPHERE_INGRESS__PORT": str(http_port),
        # Room for the idle sockets and the streams beside them (the default cap is 4,096).
        "ATMOSPHERE_INGRESS__MAX_CONNECTIONS": str(IDLE_SOCKETS + 2_000),
        "ATMOSPHERE_AI_OPENAI_ENABLED": "true",
        "ATMOSPHERE_AI_OPENAI_DEFAULT_AGENT": "assistant",
        "ATMOSPHERE_AI_OPENAI_MAX_CONCURRENT": "256",
        "ATMOSPHERE_WORKSPACE_ROOT": str(data / "workspace"),
    }
    # Every run loads and records its conversation's history in memory; the sandbox only runs
    # tools, and the fake model calls none.
    names = ("ingress", "dispatch", "tape", "governance", "memory")
    children = [subprocess.Popen([sys.executable, "-m", f"atmosphere.{name}"], env=env) for name in names]
    for child in children:
        pin(child.pid, SUT_CPUS)
    try:
        yield {name: child.pid for name, child in zip(names, children, strict=True)}
    finally:
        stop_all(children)


# -- LiteLLM -------------------------------------------------------------------------------------


def _installed_litellm(python: Path) -> str | None:
    if not python.exists():
        return None
    probe = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return probe.stdout.strip() if probe.returncode == 0 else None


def install_litellm() -> Path | None:
    """The venv's `litellm` command with the pinned version, installing it when needed; None if impossible."""
    python = LITELLM_VENV / "bin" / "python"
    command = LITELLM_VENV / "bin" / "litellm"
    if _installed_litellm(python) == LITELLM_VERSION and command.exists():
        return command
    uv = ROOT / ".atmosphere" / "tools" / "bin" / "uv"
    uv_command = str(uv) if uv.exists() else shutil.which("uv")
    if uv_command is None:
        print("LiteLLM: uv not found (run `make install`); the LiteLLM arm is skipped")
        return None
    print(f"LiteLLM: installing litellm[proxy]=={LITELLM_VERSION} into {LITELLM_VENV.relative_to(ROOT)}", flush=True)
    steps = [[uv_command, "pip", "install", "--python", str(python), f"litellm[proxy]=={LITELLM_VERSION}"]]
    if not python.exists():
        steps.insert(0, [uv_command, "venv", "--python", "3.11", str(LITELLM_VENV)])
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=900, check=False)
        except subprocess.TimeoutExpired:
            print(f"LiteLLM: `{' '.join(step[:3])}` timed out; the LiteLLM arm is skipped")
            return None
        if done.returncode != 0:
            tail = "\n    ".join((done.stdout + done.stderr).strip().splitlines()[-8:])
            print(f"LiteLLM could not be installed (no network to PyPI?); the LiteLLM arm is skipped:\n    {tail}")
            return None
    if _installed_litellm(python) != LITELLM_VERSION or not command.exists():
        print("LiteLLM: the install did not yield the pinned version; the LiteLLM arm is skipped")
        return None
    return command


@contextlib.contextmanager
def litellm_proxy(command: Path, upstream: str, scratch: Path) -> Iterator[tuple[str, int, Path]]:
    """`litellm` with one worker in front of `upstream`; its URL, pid and log file."""
    port = free_port()
    config = {
        "model_list": [
            {
                "model_name": "fake-model",
                "litellm_params": {"model": "openai/fake-model", "api_base": upstream, "api_key": "fake"},
            }
        ],
        "litellm_settings": {
            "callbacks": [],
            "success_callback": [],
            "failure_callback": [],
            "num_retries": 0,
            "request_timeout": 60,
            "telemetry": False,
            "drop_params": True,
            "set_verbose": False,
        },
        "general_settings": {"disable_spend_logs": True},
    }
    config_file = scratch / "litellm.yaml"
    config_file.write_text(json.dumps(config, indent=2))  # JSON is YAML
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DATABASE_", "REDIS_", "LITELLM_", "OPENAI_", "PROXY_"))
    }
    env |= {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the model-cost map from the internet
        "LITELLM_TELEMETRY": "False",
        "LITELLM_LOG": "ERROR",
        "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",  # no auth, as our stack here
        "NO_DOCS": "True",
        "DISABLE_ADMIN_UI": "True",
    }
    log_path = scratch / "litellm.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                str(command),
                "--config",
                str(config_file),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--num_workers",
                "1",
            ],
            env=env,
            cwd=scratch,  # no stray .env file is read
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    pin(process.pid, SUT_CPUS)
    try:
        yield f"http://127.0.0.1:{port}", process.pid, log_path
    finally:
        stop_all([process])


def log_tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n    ".join(text.strip().splitlines()[-lines:])


# -- clients -------------------------------------------------------------------------------------


class StreamError(Exception):
    """A stream that failed or came back incomplete (the message says how)."""


@dataclass
class Sample:
    ttft_ms: float
    token_ms: list[float]


def stamps(text: str, now: int) -> list[float]:
    """Latencies (ms) of the timestamps in a piece of streamed text (one, or several if merged)."""
    try:
        return [(now - int(piece)) / 1e6 for piece in text.split()]
    except ValueError:
        raise StreamError(f"a token is not a timestamp: {text[:60]!r}") from None


def complete(first: float | None, latencies: list[float]) -> Sample:
    if first is None:
        raise StreamError("no token arrived")
    if len(latencies) != TOKENS:
        raise StreamError(f"{len(latencies)} of {TOKENS} tokens arrived")
    return Sample(first, latencies)


class _Reply:
    """httptools callbacks: the body as it comes, and whether the message is complete."""

    def __init__(self) -> None:
        self.body = bytearray()
        self.headers_done = False
        self.done = False

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.done = True


@dataclass
class HttpPool:
    """Keep-alive HTTP/1.1 connections to one server, parsed with httptools.

    The load generator shares a CPU with the upstream; httpx costs several times more per line
    than this, enough to saturate that CPU at 16 streams and show up as everyone's latency.
    """

    host: str
    port: int
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(default_factory=list)

    @classmethod
    def of(cls, url: str) -> HttpPool:
        address = httpx.URL(url)
        assert address.port is not None
        return cls(address.host, address.port)

    async def acquire(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bool]:
        while self.idle:
            reader, writer = self.idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer, True
            writer.close()
        reader, writer = await asyncio.open_connection(self.host, self.port)
        return reader, writer, False

    def release(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, keep: bool) -> None:
        if keep:
            self.idle.append((reader, writer))
        else:
            writer.close()

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


@dataclass
class _Tokens:
    """What one SSE stream delivered."""

    started: int
    first: float | None = None
    latencies: list[float] = field(default_factory=list)
    done: bool = False

    def line(self, line: bytes, now: int) -> None:
        if not line.startswith(b"data: "):
            return
        if line == b"data: [DONE]":
            self.done = True
            return
        chunk = json.loads(line[6:])
        if "error" in chunk:
            raise StreamError(f"error chunk: {json.dumps(chunk['error'])[:160]}")
        for choice in chunk.get("choices", []):
            content = (choice.get("delta") or {}).get("content")
            if content:
                if self.first is None:
                    self.first = (time.perf_counter_ns() - self.started) / 1e6
                self.latencies += stamps(content, now)


async def sse_stream(pool: HttpPool, path: str, model: str) -> Sample:
    """One streamed OpenAI chat completion, read to the end of the response."""
    payload = json.dumps({"model": model, **PROMPT}).encode()
    request = (
        f"POST {path} HTTP/1.1\r\nHost: {pool.host}:{pool.port}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    tokens = _Tokens(time.perf_counter_ns())
    for attempt in range(2):
        reader, writer, reused = await pool.acquire()
        reply = _Reply()
        parser = httptools.HttpResponseParser(reply)
        keep = False
        try:
            writer.write(request)
            while not reply.done:
                data = await reader.read(65536)
                if not data:
                    break
                now = time.time_ns()
                parser.feed_data(data)
                if reply.headers_done and parser.get_status_code() == 200:
                    while (end := reply.body.find(b"\n")) >= 0:
                        line = bytes(reply.body[:end]).rstrip(b"\r")
                        del reply.body[: end + 1]
                        tokens.line(line, now)
            keep = reply.done and parser.should_keep_alive()
        except httptools.HttpParserError as exc:
            raise StreamError(f"malformed HTTP response: {exc}") from None
        finally:
            pool.release(reader, writer, keep)
        if not reply.headers_done and reused and attempt == 0:
            continue  # the server had closed the idle connection: once more on a new one
        break
    if not reply.done:
        raise StreamError("the server closed the connection mid-response")
    if parser.get_status_code() != 200:
        raise StreamError(f"HTTP {parser.get_status_code()}: {reply.body.decode(errors='replace').strip()[:400]}")
    if not tokens.done:
        raise StreamError("the stream ended without [DONE]")
    return complete(tokens.first, tokens.latencies)


async def ws_stream(url: str) -> Sample:
    """One conversation of one prompt: a new socket, the prompt, its frames through the terminal one.

    A socket is a conversation (its history is kept in memory), so each stream opens its own,
    as each OpenAI request is its own conversation; the clock starts at the prompt, after the
    handshake, as the HTTP arms reuse their connections.
    """
    async with websockets.connect(url, compression=None, max_size=None, open_timeout=30) as ws:
        started = time.perf_counter_ns()
        first: float | None = None
        latencies: list[float] = []
        await ws.send("go")
        while True:
            try:
                raw = await ws.recv()
            except websockets.ConnectionClosed as exc:
                raise StreamError(f"socket closed mid-run: {exc}") from None
            now = time.time_ns()
            frame = json.loads(raw)
            kind = frame.get("type")
            if kind == "streaming-text":
                if first is None:
                    first = (time.perf_counter_ns() - started) / 1e6
                latencies += stamps(frame.get("data", ""), now)
            elif kind == "error":
                raise StreamError(f"error frame {frame.get('code')}: {str(frame.get('data'))[:140]}")
            elif kind == "complete" and frame.get("seq", 0) > 0:
                return complete(first, latencies)


# -- arms, rounds, report ------------------------------------------------------------------------


@dataclass
class Stats:
    """One arm at one concurrency: per-round percentiles, CPU and tokens over the kept rounds."""

    ttft_p50: list[float] = field(default_factory=list)
    ttft_p99: list[float] = field(default_factory=list)
    token_p50: list[float] = field(default_factory=list)
    token_p99: list[float] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)
    """CPU seconds by server process."""
    cpu_rounds: list[float] = field(default_factory=list)
    """The servers' total CPU µs per token of each kept block."""
    tokens: int = 0
    upstream_cpu: float = 0.0
    load_busy: float = 0.0
    """The busiest block's CPU of the load generator and the upstream (fraction of one core)."""
    server_busy: float = 0.0
    """The busiest block's CPU of the arm's servers (fraction of one core)."""
    errors: Counter[str] = field(default_factory=Counter)

    def add(self, samples: list[Sample]) -> None:
        if not samples:
            return
        ttft = [s.ttft_ms for s in samples]
        tokens = [t for s in samples for t in s.token_ms]
        self.ttft_p50.append(percentile(ttft, 50))
        self.ttft_p99.append(percentile(ttft, 99))
        self.token_p50.append(percentile(tokens, 50))
        self.token_p99.append(percentile(tokens, 99))
        self.tokens += len(tokens)

    @property
    def cpu_per_token(self) -> float | None:
        return sum(self.cpu.values()) / self.tokens * 1e6 if self.tokens and self.cpu else None


@dataclass
class Arm:
    name: str
    run_one: Callable[[int], Awaitable[Sample]]
    servers: dict[str, int]
    """The arm's server processes by name (none: nothing between client and upstream)."""

    def cpu(self) -> dict[str, float]:
        return {name: cpu_seconds([pid]) for name, pid in self.servers.items()}


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


def block_size(concurrency: int, streams: int) -> int:
    # At least two streams per client: with one, a block at 64 would be a single burst of 64
    # requests arriving together rather than 64 streams in flight.
    return max(streams, 2 * concurrency if concurrency > 1 else 1)


async def block(arm: Arm, concurrency: int, streams: int, errors: Counter[str]) -> list[Sample]:
    """`streams` streams with `concurrency` in flight (closed loop: each client starts its next at once).

    The clients start spread over one stream's nominal length, so streams overlap as they would
    in steady traffic instead of moving in lockstep waves.
    """
    samples: list[Sample] = []
    left = streams
    spread = (TOKENS + 3) * TOKEN_GAP / concurrency

    async def client(index: int) -> None:
        nonlocal left
        await asyncio.sleep(index * spread)
        while left > 0:
            left -= 1
            try:
                async with asyncio.timeout(STREAM_TIMEOUT):
                    samples.append(await arm.run_one(index))
            except (StreamError, httpx.HTTPError, websockets.WebSocketException, OSError, TimeoutError) as exc:
                errors[f"{type(exc).__name__}: {exc}"[:400]] += 1

    await asyncio.gather(*(client(i) for i in range(concurrency)))
    return samples


async def measure(
    arms: list[Arm], concurrency: int, rounds: int, streams: int, upstream_pid: int, rng: random.Random
) -> dict[str, Stats]:
    stats = {arm.name: Stats() for arm in arms}
    for index in range(rounds + 1):  # the first round warms up and is discarded
        order = list(arms)
        rng.shuffle(order)
        for arm in order:
            mine = stats[arm.name]
            errors: Counter[str] = Counter()
            cpu, upstream, load, wall = arm.cpu(), cpu_seconds([upstream_pid]), time.process_time(), time.perf_counter()
            samples = await block(arm, concurrency, block_size(concurrency, streams), errors)
            upstream_used = cpu_seconds([upstream_pid]) - upstream
            busy = (time.process_time() - load + upstream_used) / (time.perf_counter() - wall)
            await asyncio.sleep(SETTLE)
            used = {name: spent - cpu[name] for name, spent in arm.cpu().items()}
            elapsed = time.perf_counter() - wall
            if index:
                mine.add(samples)
                mine.errors.update(errors)
                if (delivered := sum(len(sample.token_ms) for sample in samples)) and used:
                    mine.cpu_rounds.append(sum(used.values()) / delivered * 1e6)
                for name, spent in used.items():
                    mine.cpu[name] = mine.cpu.get(name, 0.0) + spent
                mine.upstream_cpu += upstream_used
                mine.load_busy = max(mine.load_busy, busy)
                mine.server_busy = max(mine.server_busy, sum(used.values()) / elapsed)
    return stats


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def added(direct: list[float], via: list[float]) -> float | None:
    if not via or len(direct) != len(via):
        return None
    return statistics.median(y - x for x, y in zip(direct, via, strict=True))


@dataclass
class Row:
    name: str
    absolute: list[float | None]
    added: list[float | None]
    cpu: float | None
    server_busy: float | None
    load_busy: float


def num(value: float | None, width: int, digits: int = 2, sign: bool = False) -> str:
    if value is None:
        return f"{'—':>{width}}"
    return f"{value:{'+' if sign else ''}{width}.{digits}f}"


def ratio(ours: float | None, theirs: float | None, width: int) -> str:
    if ours is None or theirs is None or theirs <= 0:
        return f"{'n/a':>{width}}"
    return f"{ours / theirs:>{width - 1}.2f}×"


def report(concurrency: int, rounds: int, streams: int, stats: dict[str, Stats]) -> dict[str, Row]:
    direct = stats[DIRECT]
    rows: dict[str, Row] = {}
    for name, s in stats.items():
        rows[name] = Row(
            name,
            [median(s.ttft_p50), median(s.ttft_p99), median(s.token_p50), median(s.token_p99)],
            [None] * 4
            if name == DIRECT
            else [
                added(direct.ttft_p50, s.ttft_p50),
                added(direct.ttft_p99, s.ttft_p99),
                added(direct.token_p50, s.token_p50),
                added(direct.token_p99, s.token_p99),
            ],
            None if name == DIRECT else s.cpu_per_token,
            None if name == DIRECT else s.server_busy * 100,
            s.load_busy,
        )
    print(
        f"\n{concurrency} concurrent stream(s), {block_size(concurrency, streams)} streams per arm per round, "
        f"median of {rounds} rounds (ms; CPU in µs per token, busiest block's CPU in % of one core)"
    )
    print(
        f"  {'':27}{'TTFT p50':>9}{'p99':>9}{'token p50':>10}{'p99':>8}  "
        f"{'+TTFT p50':>10}{'p99':>10}{'+token p50':>11}{'p99':>10}{'CPU/token':>10}{'server':>8}{'load':>6}"
    )
    lite = rows.get(LITELLM)
    for name, row in rows.items():
        a, d = row.absolute, row.added
        print(
            f"  {name:<27}{num(a[0], 9)}{num(a[1], 9)}{num(a[2], 10)}{num(a[3], 8)}  "
            f"{num(d[0], 10, sign=True)}{num(d[1], 10, sign=True)}{num(d[2], 11, sign=True)}{num(d[3], 10, sign=True)}"
            f"{num(row.cpu, 10, 0)}{'—' if row.server_busy is None else f'{row.server_busy:.0f}%':>8}"
            f"{row.load_busy * 100:5.0f}%"
        )
        if lite is not None and name in (OPENAI, WEBSOCKET):
            versus, lite_cpu = lite.added, lite.cpu
            print(
                f"  {'  ÷ LiteLLM':<27}{'':36}  {ratio(d[0], versus[0], 10)}{ratio(d[1], versus[1], 10)}"
                f"{ratio(d[2], versus[2], 11)}{ratio(d[3], versus[3], 10)}{ratio(row.cpu, lite_cpu, 10)}"
            )
    for name in (OPENAI, WEBSOCKET):
        if stats[name].tokens:
            print(f"  {name} {per_token_line(stats[name].cpu, stats[name].tokens, stats[name].cpu_rounds)}")
    upstream_tokens = sum(s.tokens for s in stats.values())
    if upstream_tokens:
        upstream = sum(s.upstream_cpu for s in stats.values()) / upstream_tokens * 1e6
        print(f"  fake upstream: {upstream:.0f} µs CPU per token")
    for name, s in stats.items():
        for message, count in s.errors.most_common(5):
            print(f"  ERRORS {name}: {count}× {message}")
    return rows


# -- idle WebSockets -----------------------------------------------------------------------------


async def idle_sockets(url: str, ingress_pid: int, count: int) -> tuple[float, float, int, int]:
    """KiB of ingress PSS per idle socket at `count` (from zero) and between count/2 and count; open ones; `count`."""
    opened: list[websockets.ClientConnection] = []
    before = memory_kib(ingress_pid)
    half = 0
    try:
        while len(opened) < count:
            batch = min(100, count - len(opened))
            opened += await asyncio.gather(
                *(websockets.connect(url, compression=None, ping_interval=None, open_timeout=60) for _ in range(batch))
            )
            if len(opened) == count // 2:
                await asyncio.sleep(2)
                half = memory_kib(ingress_pid)
        await asyncio.sleep(2)
        after = memory_kib(ingress_pid)
        still_open = sum(ws.state is State.OPEN for ws in opened)
    finally:
        for start in range(0, len(opened), 200):
            await asyncio.gather(*(ws.close() for ws in opened[start : start + 200]), return_exceptions=True)
    return (after - before) / count, (after - half) / (count - count // 2), still_open, count


def idle_count() -> int:
    """`IDLE_SOCKETS`, or fewer when this process may not open that many descriptors (said when so)."""
    room = resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 500  # the streams' sockets, the children's pipes
    if room < IDLE_SOCKETS:
        print(f"idle WebSockets: the descriptor limit allows {room:,}, not {IDLE_SOCKETS:,}")
    return max(2, min(IDLE_SOCKETS, room))


# -- the run -------------------------------------------------------------------------------------


async def wait_ready(url: str, attempt: Callable[[], Awaitable[object]], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            await attempt()
            return
        except (StreamError, httpx.HTTPError, websockets.WebSocketException, OSError, AssertionError) as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} at {url} did not get ready: {exc}") from exc
            await asyncio.sleep(0.5)


@contextlib.asynccontextmanager
async def litellm_arm(
    command: Path | None, upstream: str, scratch: Path, client: httpx.AsyncClient
) -> AsyncIterator[Arm | None]:
    if command is None:
        yield None
        return
    with litellm_proxy(command, upstream, scratch) as (url, pid, log):
        pool = HttpPool.of(url)

        async def health() -> None:
            if (await client.get(f"{url}/health/liveliness")).status_code != 200:
                raise StreamError("not live yet")
            await sse_stream(pool, "/v1/chat/completions", "fake-model")

        try:
            await wait_ready(url, health, "LiteLLM", timeout=180)
        except RuntimeError as exc:
            print(f"{exc}; the LiteLLM arm is skipped. Its log:\n    {log_tail(log)}")
            yield None
            return
        pin(pid, SUT_CPUS)
        yield Arm(LITELLM, lambda _: sse_stream(pool, "/v1/chat/completions", "fake-model"), {"litellm": pid})
        pool.close()


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def targets(results: dict[int, dict[str, Row]], idle: tuple[float, float, int, int] | None) -> None:
    """The performance issue's targets: added TTFT and CPU per token beside LiteLLM, the idle socket."""
    print("\ntargets")
    for name in (OPENAI, WEBSOCKET):
        for concurrency, limit in ((1, 10.0), (16, 10.0), (64, 50.0)):
            p50 = results[concurrency][name].added[0]
            shown = "no samples" if p50 is None else f"{p50:+.2f} ms"
            ok = p50 is not None and p50 <= limit
            print(f"  {name}: added TTFT p50 at {concurrency} stream(s) <= {limit:g} ms: {verdict(ok)} ({shown})")
        lite = results[64].get(LITELLM)
        ours = results[64][name]
        if lite is None:
            print(f"  {name}: beside LiteLLM: n/a (LiteLLM not run)")
            continue
        share(name, "added TTFT p99 at 64 streams", ours.added[1], lite.added[1], divisor=10)
        share(name, "CPU per token at 64 streams", ours.cpu, lite.cpu, divisor=4)
        one, lite_one = results[1][name], results[1].get(LITELLM)
        share(name, "CPU per token at 1 stream", one.cpu, lite_one.cpu if lite_one else None, divisor=None)
    if idle is not None:
        per, marginal, still_open, count = idle
        ok = per <= 24 and still_open == count == IDLE_SOCKETS
        print(
            f"  idle WebSocket <= 24 KiB at {IDLE_SOCKETS:,} connections: {verdict(ok)}"
            f"{'' if count == IDLE_SOCKETS else f' (measured at {count:,})'}"
            f" ({per:.1f} KiB of ingress PSS each; {marginal:.1f} KiB each over the second half; "
            f"{still_open:,} still open after 2 s idle)"
        )


def share(name: str, what: str, ours: float | None, theirs: float | None, *, divisor: int | None) -> None:
    """One target beside LiteLLM: ours <= 1/`divisor` of theirs, or strictly below theirs (None)."""
    wanted = "below" if divisor is None else f"<= 1/{divisor} of"
    if ours is None or theirs is None or theirs <= 0:
        print(f"  {name}: {what} {wanted} LiteLLM's: n/a")
        return
    ok = ours < theirs if divisor is None else ours <= theirs / divisor
    print(f"  {name}: {what} {wanted} LiteLLM's: {verdict(ok)} ({ours:.2f} vs {theirs:.2f}, {ours / theirs:.2f}×)")


async def main(rounds: int, streams: int, skip_litellm: bool, litellm: Path | None) -> int:
    rng = random.Random(7)
    failures = lite_failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        nats = NatsServer(scratch / "nats").start()
        pin(nats.pid, SUT_CPUS)
        http_port = free_port()
        base = f"http://127.0.0.1:{http_port}"
        socket_url = f"ws://127.0.0.1:{http_port}/atmosphere/agent/assistant"
        try:
            with (
                fake_upstream() as (upstream, upstream_pid),
                our_services(nats.url, upstream, scratch / "data", http_port) as ours,
            ):
                async with (
                    httpx.AsyncClient(timeout=10) as client,
                    litellm_arm(None if skip_litellm else litellm, upstream, scratch, client) as lite,
                ):
                    sut = {"nats-server": nats.pid, **ours}
                    direct, ingress = HttpPool.of(upstream), HttpPool.of(base)
                    arms = [
                        Arm(DIRECT, lambda _: sse_stream(direct, "/v1/chat/completions", "fake-model"), {}),
                        Arm(OPENAI, lambda _: sse_stream(ingress, "/atmosphere/v1/chat/completions", "assistant"), sut),
                        Arm(WEBSOCKET, lambda _: ws_stream(socket_url), sut),
                    ]
                    if lite is not None:
                        arms.append(lite)

                    async def ready() -> None:
                        assert (await client.get(f"{base}/readyz")).status_code == 200

                    await wait_ready(base, ready, "ingress")
                    for arm in arms:  # one warm-up run through each arm
                        await wait_ready(arm.name, functools.partial(arm.run_one, 0), arm.name)
                    for pid in sut.values():  # threads started before the first pin
                        pin(pid, SUT_CPUS)

                    idle = await idle_sockets(socket_url, ours["ingress"], idle_count())
                    print(f"idle WebSockets: {idle[0]:.1f} KiB of ingress PSS per connection at {idle[3]:,}")

                    print(
                        f"\neach stream: {TOKENS} tokens {TOKEN_GAP * 1000:.0f} ms apart from the upstream "
                        f"(the first after {2 * TOKEN_GAP * 1000:.0f} ms); ours run examples.assistant, no tools"
                    )
                    results: dict[int, dict[str, Row]] = {}
                    for concurrency in CONCURRENCY:
                        stats = await measure(arms, concurrency, rounds, streams, upstream_pid, rng)
                        results[concurrency] = report(concurrency, rounds, streams, stats)
                        failures += sum(s.errors.total() for name, s in stats.items() if name != LITELLM)
                        lite_failures += stats[LITELLM].errors.total() if LITELLM in stats else 0
                    direct.close()
                    ingress.close()
                    if lite is None:
                        print("\nLiteLLM was not run: ratios are n/a")
                    elif lite_failures:
                        errors = [
                            line for line in log_tail(scratch / "litellm.log", 400).splitlines() if "Error" in line
                        ]
                        print(
                            f"\nLiteLLM's log on its {lite_failures} failed stream(s), last lines:\n"
                            + "\n".join(errors[-6:])
                        )
                    targets(results, idle)
        finally:
            nats.stop()
    if failures:
        print(f"\n{failures} stream(s) failed directly or through ingress (see ERRORS above)")
    return 1 if failures else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="kept rounds (one more warms up)")
    parser.add_argument("--streams", type=int, default=32, help="streams per arm per round (at least 2 per client)")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 16 streams: a smoke test, not a result")
    parser.add_argument("--no-pin", action="store_true", help="do not pin the SUT and the load to separate CPUs")
    parser.add_argument("--skip-litellm", action="store_true", help="run without the LiteLLM arm (ratios are n/a)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.streams = 2, 16
    # 10,000 idle sockets need as many descriptors here and in ingress (children inherit the limit).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 65536 if hard == resource.RLIM_INFINITY else hard
    if wanted > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    cpus = sorted(os.sched_getaffinity(0))
    if not args.no_pin and len(cpus) >= 2:
        SUT_CPUS.add(cpus[0])
        LOAD_CPUS.add(cpus[1])
        pin(os.getpid(), LOAD_CPUS)
        print(f"system under test on CPU {cpus[0]}; load generator and upstream on CPU {cpus[1]}")
    command = None if args.skip_litellm else install_litellm()
    if command is not None:
        print(f"LiteLLM {LITELLM_VERSION} from {LITELLM_VENV.relative_to(ROOT)}")
    # The clients of every arm run on the same loop as the services do (uvloop when installed).
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        raise SystemExit(runner.run(main(args.rounds, args.streams, args.skip_litellm, command)))
