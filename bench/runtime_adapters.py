"""Each runtime adapter: its framework's loop called directly, beside the same agent through the platform.

For every adapter of this environment (the main one: `langchain`, `langgraph`, `pydantic-ai`,
`openai-agents`, `anthropic`, `cohere`, `adk`, `agentscope`; the pinned one, `.venvs/pinned`:
`crewai`, `semantic-kernel`, `llamaindex`), two arms stream the same 20-token answer from one
scripted provider (OpenAI's wire, or the adapter's native one: Anthropic's, Cohere's, Gemini's):

- directly: the adapter's runtime, in this process, runs the agent's request (`execute`, no
  platform: the framework's own loop and the adapter, nothing else), its CPU this process's;
- through the platform: a gRPC `Run` of the agent `forecaster-<runtime>` (examples/runtimes/
  pinned.py: its tool offered, its harness on) to that runtime's own dispatch pool, with
  nats-server, governance, tape and memory as real processes, its CPU theirs and the pool's.

The model never calls the tool (it answers with text), so both arms make one model call a run.

Arms are interleaved in shuffled rounds, one stream at a time. The report, per adapter: time to
first token (median of the rounds' p50) of each arm and what the platform adds, and CPU per run
and per token of each arm. The built-in runtime's own figures are `bench/dispatch_overhead.py`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _cpu import cpu_seconds

from atmosphere.bus.runs import SinkHost
from atmosphere.contracts.dispatch.v1 import dispatch_pb2, dispatch_pb2_grpc
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.sdk import AiRequest, StreamingSession
from atmosphere.sdk.runtime import AgentExecutionContext, AgentRuntime, RuntimeConfig, ToolSpec, discover_runtimes
from atmosphere.service import loop_factory
from atmosphere.testing import NatsServer, free_port
from examples.runtimes.pinned import get_weather

ROOT = Path(__file__).resolve().parent.parent
PINNED = ("crewai", "semantic-kernel", "llamaindex")
"""The adapters of the pinned environment: run this file with `.venvs/pinned/bin/python` for them."""
ADAPTERS = (
    PINNED
    if importlib.util.find_spec("crewai") is not None
    else ("langchain", "langgraph", "pydantic-ai", "openai-agents", "anthropic", "cohere", "adk", "agentscope")
)
"""The adapters installed in this environment."""
APP = "examples.runtimes.pinned:app"
TOKENS = 20
TOKEN_GAP = 0.002
SETTLE = 0.2
"""Seconds after each platform block before the services' CPU is read (the tape writes a little behind)."""
SYSTEM = "You answer weather questions in one sentence, using get_weather."
"""The agent's system prompt (examples/runtimes/pinned.py), sent by both arms."""


@dataclass
class Arm:
    name: str
    ttft_ms: list[float] = field(default_factory=list)
    """The p50 time to first token of each round."""
    cpu_per_run_ms: list[float] = field(default_factory=list)
    cpu_per_token_us: list[float] = field(default_factory=list)

    def add(self, ttfts: list[float], cpu_seconds_spent: float, runs: int, tokens: int) -> None:
        self.ttft_ms.append(statistics.median(ttfts))
        self.cpu_per_run_ms.append(cpu_seconds_spent / runs * 1e3)
        self.cpu_per_token_us.append(cpu_seconds_spent / max(1, tokens) * 1e6)


def settings(provider_url: str) -> dict[str, str]:
    """The model settings of both arms: the OpenAI wire's `LLM_*`, the native adapters' own."""
    root = provider_url.removesuffix("/v1")
    return {
        "LLM_BASE_URL": provider_url,
        "LLM_MODEL": "fake-model",
        "ANTHROPIC_BASE_URL": root,
        "ANTHROPIC_API_KEY": "bench",
        "ANTHROPIC_MODEL": "fake-model",
        "COHERE_BASE_URL": root,
        "CO_API_KEY": "bench",
        "COHERE_MODEL": "fake-model",
        "GOOGLE_GEMINI_BASE_URL": root,
        "GOOGLE_API_KEY": "bench",
        "GEMINI_MODEL": "fake-model",
    }


def runtime(name: str, provider_url: str) -> AgentRuntime:
    """The adapter as dispatch would build it, configured for the scripted provider."""
    config = RuntimeConfig(base_url=provider_url, model="fake-model")
    [found] = [r for r in discover_runtimes(config, environ=settings(provider_url)) if r.name == name]
    return found


async def direct_run(adapter: AgentRuntime) -> tuple[float, int]:
    """One run on the adapter alone: (ms to the first text, text deltas)."""
    first: list[float] = []
    deltas = 0
    started = time.perf_counter()

    async def sink(event: RunEvent) -> None:
        nonlocal deltas
        if event.WhichOneof("kind") == "text_delta":
            deltas += 1
            if not first:
                first.append((time.perf_counter() - started) * 1e3)

    session = StreamingSession(SinkHost(sink), run_id="bench", session_id="bench", conversation_id="bench")
    request = AiRequest(message="Weather in Paris?", system_prompt=SYSTEM)
    ctx = AgentExecutionContext(
        run_id="bench", agent="bench", conversation_id="c", request=request, tools=(ToolSpec.of(get_weather),)
    )
    await adapter.execute(ctx, session)
    assert first, "no text arrived"
    return first[0], deltas


async def platform_run(stub: dispatch_pb2_grpc.DispatchServiceStub, agent: str) -> tuple[float, int]:
    """One gRPC `Run`: (ms to the first text, text deltas)."""
    started = time.perf_counter()
    first: float | None = None
    deltas = 0
    async for response in stub.Run(dispatch_pb2.RunRequest(agent=agent, message="Weather in Paris?")):
        kind = response.event.WhichOneof("kind")
        if kind == "text_delta":
            deltas += 1
            if first is None:
                first = (time.perf_counter() - started) * 1e3
        elif kind == "error":
            raise RuntimeError(response.event.error.message)
    assert first is not None, "no text arrived"
    return first, deltas


@contextlib.contextmanager
def fake_upstream() -> Iterator[str]:
    """The scripted provider (both wires) in a process of its own."""
    port = free_port()
    argv = [sys.executable, "-m", "atmosphere.testing.model_server", "--port", str(port), "--tokens", str(TOKENS)]
    process = subprocess.Popen([*argv, "--chunk-delay", str(TOKEN_GAP)])
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        process.wait(10)


@contextlib.contextmanager
def services(nats_url: str, provider_url: str, data: Path, grpc_ports: dict[str, int]) -> Iterator[dict[str, int]]:
    """governance, tape, memory and a dispatch pool per adapter, as processes; their pids by name."""
    env = {
        **os.environ,
        **settings(provider_url),
        "ATMOSPHERE_NATS__URL": nats_url,
        "ATMOSPHERE_DATA_DIR": str(data),
        "ATMOSPHERE_APP": APP,
        "ATMOSPHERE_APP_DIR": str(ROOT),
        "ATMOSPHERE_LOG__LEVEL": "WARNING",
        "ATMOSPHERE_PROBE_PORT": "0",
        "ATMOSPHERE_DISPATCH__GRPC_HOST": "127.0.0.1",
        "ATMOSPHERE_DISPATCH__POOLS": ",".join(grpc_ports),
    }
    children = {name: [sys.executable, "-m", f"atmosphere.{name}"] for name in ("governance", "tape", "memory")}
    started = {name: subprocess.Popen(argv, env=env) for name, argv in children.items()}
    for pool, port in grpc_ports.items():
        pool_env = {**env, "ATMOSPHERE_DISPATCH__POOL": pool, "ATMOSPHERE_DISPATCH__GRPC_PORT": str(port)}
        started[f"dispatch-{pool}"] = subprocess.Popen([sys.executable, "-m", "atmosphere.dispatch"], env=pool_env)
    try:
        yield {name: child.pid for name, child in started.items()}
    finally:
        for child in started.values():
            child.terminate()
        for child in started.values():
            child.wait(15)


async def until_answering(stub: dispatch_pb2_grpc.DispatchServiceStub, agent: str) -> None:
    deadline = time.monotonic() + 90
    while True:
        try:
            await platform_run(stub, agent)
            return
        except (grpc.aio.AioRpcError, RuntimeError, AssertionError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


@contextlib.asynccontextmanager
async def platform(
    scratch: Path, provider_url: str, adapters: tuple[str, ...]
) -> AsyncIterator[tuple[dict[str, object], dict[str, int]]]:
    """A stub per adapter's pool, and the pids of the system under test by name."""
    server = NatsServer(scratch / "nats").start()
    ports = {pool: free_port() for pool in adapters}
    try:
        with services(server.url, provider_url, scratch / "data", ports) as pids:
            async with contextlib.AsyncExitStack() as stack:
                stubs: dict[str, object] = {}
                for pool, port in ports.items():
                    channel = await stack.enter_async_context(grpc.aio.insecure_channel(f"127.0.0.1:{port}"))
                    stubs[pool] = dispatch_pb2_grpc.DispatchServiceStub(channel)
                    await until_answering(stubs[pool], f"forecaster-{pool}")  # type: ignore[arg-type]
                yield stubs, {**pids, "nats-server": server.pid}
    finally:
        server.stop()


async def measure(adapter: str, provider_url: str, stub: object, pids: dict[str, int], rounds: int, runs: int) -> None:
    direct, via = Arm("directly"), Arm("through the platform")
    engine = runtime(adapter, provider_url)
    shared = ["nats-server", "governance", "tape", "memory", f"dispatch-{adapter}"]
    system_pids = [pids[name] for name in shared]
    try:
        arms = ["direct", "platform"]
        for index in range(rounds + 1):  # the first round warms up and is discarded
            random.shuffle(arms)
            for arm in arms:
                ttfts: list[float] = []
                tokens = 0
                if arm == "direct":
                    before = time.process_time()
                    for _ in range(runs):
                        ttft, deltas = await direct_run(engine)
                        ttfts.append(ttft)
                        tokens += deltas
                    spent = time.process_time() - before
                else:
                    mark = cpu_seconds(system_pids)
                    for _ in range(runs):
                        ttft, deltas = await platform_run(stub, f"forecaster-{adapter}")  # type: ignore[arg-type]
                        ttfts.append(ttft)
                        tokens += deltas
                    await asyncio.sleep(SETTLE)
                    spent = cpu_seconds(system_pids) - mark
                if index:
                    (direct if arm == "direct" else via).add(ttfts, spent, runs, tokens)
    finally:
        await engine.aclose()
    report(adapter, direct, via)


def report(adapter: str, direct: Arm, via: Arm) -> None:
    def median(values: list[float]) -> float:
        return statistics.median(values)

    print(f"\n{adapter}: median of {len(direct.ttft_ms)} rounds, one stream at a time")
    print(f"  {'':24}{'TTFT p50 ms':>13}{'CPU/run ms':>12}{'CPU/token µs':>14}")
    for arm in (direct, via):
        print(
            f"  {arm.name:<24}{median(arm.ttft_ms):13.2f}{median(arm.cpu_per_run_ms):12.2f}"
            f"{median(arm.cpu_per_token_us):14.1f}"
        )
    added = statistics.median(v - d for d, v in zip(direct.ttft_ms, via.ttft_ms, strict=True))
    ratio = median(via.cpu_per_run_ms) / median(direct.cpu_per_run_ms)
    print(f"  added by the platform: TTFT {added:+.2f} ms; CPU per run x{ratio:.2f} of the framework's own")


async def main(rounds: int, runs: int, only: tuple[str, ...]) -> int:
    with tempfile.TemporaryDirectory() as scratch, fake_upstream() as provider_url:
        async with platform(Path(scratch), provider_url, only) as (stubs, pids):
            for adapter in only:
                await measure(adapter, provider_url, stubs[adapter], pids, rounds, runs)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=8, help="runs per arm per round")
    parser.add_argument("--only", default=",".join(ADAPTERS), help="comma-separated adapters")
    args = parser.parse_args()
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        raise SystemExit(runner.run(main(args.rounds, args.runs, tuple(args.only.split(",")))))
