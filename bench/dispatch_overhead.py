"""What dispatch adds between a client and the model: gRPC `Run` versus the provider directly.

Both arms stream from the same scripted provider, whose tokens carry their send time in ns, so
each token's latency is measured end to end on one clock. The system under test runs as real
processes: nats-server, governance, tape, memory (the agent has conversation memory, so every run
loads and records its history there) and dispatch (with `LLM_BASE_URL` at the provider).
Arms are interleaved in shuffled rounds at 1 and 16 concurrent streams; the report is the
median over rounds of the per-round difference (gRPC minus direct) of p50 and p99.

CPU per token: the user + system time (`/proc/<pid>/stat`) of each process of the system under
test over the gRPC arm's kept blocks (each read 0.2 s after its block ends, as the tape writes a
little behind), divided by the tokens that arm delivered, per process and in total. It covers a
run's whole cost (history, recording, the broker) spread over its tokens; issue 8 holds the
total within 10 % of the code before it.

Targets (issue 3): added time-to-first-token p50 <= 3 ms and added per-token p50 <= 0.5 ms at
16 streams.

With two or more CPUs the system under test is pinned to CPU 0 and the load generator (this
process) and the fake upstream to CPU 1, so neither side's load shows up as the other's
latency (`--no-pin` turns that off).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cpu import CpuMeter

from atmosphere.contracts.dispatch.v1 import dispatch_pb2, dispatch_pb2_grpc
from atmosphere.service import loop_factory
from atmosphere.testing import NatsServer, free_port

ROOT = Path(__file__).resolve().parent.parent
SUT_CPUS: set[int] = set()
LOAD_CPUS: set[int] = set()


def pin(pid: int, cpus: set[int]) -> None:
    if cpus:
        os.sched_setaffinity(pid, cpus)


TOKENS = 20
TOKEN_GAP = 0.005
SETTLE = 0.2
"""Seconds after each measured block before the services' CPU is read (the tape writes a little behind)."""


@dataclass
class Sample:
    ttft_ms: float
    token_ms: list[float]


@dataclass
class ArmStats:
    name: str
    ttft_p50: list[float] = field(default_factory=list)
    ttft_p99: list[float] = field(default_factory=list)
    token_p50: list[float] = field(default_factory=list)
    token_p99: list[float] = field(default_factory=list)

    def add(self, samples: list[Sample]) -> None:
        ttft = [s.ttft_ms for s in samples]
        tokens = [t for s in samples for t in s.token_ms]
        self.ttft_p50.append(percentile(ttft, 50))
        self.ttft_p99.append(percentile(ttft, 99))
        self.token_p50.append(percentile(tokens, 50))
        self.token_p99.append(percentile(tokens, 99))


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


async def direct_stream(client: httpx.AsyncClient, base_url: str) -> Sample:
    body = {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": "go"}]}
    started = time.perf_counter_ns()
    first: float | None = None
    latencies: list[float] = []
    async with client.stream("POST", f"{base_url}/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            now = time.time_ns()
            for choice in json.loads(line[6:]).get("choices", []):
                content = choice.get("delta", {}).get("content")
                if content:
                    if first is None:
                        first = (time.perf_counter_ns() - started) / 1e6
                    latencies += [(now - int(stamp)) / 1e6 for stamp in content.split()]
    assert first is not None
    return Sample(first, latencies)


async def grpc_stream(stub: dispatch_pb2_grpc.DispatchServiceStub) -> Sample:
    started = time.perf_counter_ns()
    first: float | None = None
    latencies: list[float] = []
    async for response in stub.Run(dispatch_pb2.RunRequest(agent="assistant", message="go")):
        event = response.event
        if event.WhichOneof("kind") == "text_delta":
            now = time.time_ns()
            if first is None:
                first = (time.perf_counter_ns() - started) / 1e6
            latencies += [(now - int(stamp)) / 1e6 for stamp in event.text_delta.text.split()]
        elif event.WhichOneof("kind") == "error":
            raise RuntimeError(event.error.message)
    assert first is not None, "no text arrived"
    return Sample(first, latencies)


async def block(run_one: Callable[[], Awaitable[Sample]], concurrency: int, streams: int) -> list[Sample]:
    samples: list[Sample] = []
    for _ in range(max(1, streams // concurrency)):
        samples += await asyncio.gather(*(run_one() for _ in range(concurrency)))
    return samples


async def metered_block(
    run_one: Callable[[], Awaitable[Sample]], concurrency: int, streams: int, meter: CpuMeter | None, *, keep: bool
) -> list[Sample]:
    """One block; with a meter, the CPU it cost the system under test is recorded when `keep`."""
    if meter is None:
        return await block(run_one, concurrency, streams)
    mark = meter.read()
    samples = await block(run_one, concurrency, streams)
    await asyncio.sleep(SETTLE)
    if keep:
        meter.record(mark, sum(len(sample.token_ms) for sample in samples))
    return samples


@contextlib.contextmanager
def processes(nats_url: str, provider_url: str, data: Path, grpc_port: int) -> Iterator[dict[str, int]]:
    """The services under test as processes of their own; their pids by name."""
    env = {
        **os.environ,
        "ATMOSPHERE_NATS__URL": nats_url,
        "ATMOSPHERE_DATA_DIR": str(data),
        "ATMOSPHERE_APP": "examples.assistant:app",
        "ATMOSPHERE_APP_DIR": str(ROOT),
        "ATMOSPHERE_LOG__LEVEL": "WARNING",
        "ATMOSPHERE_PROBE_PORT": "0",
        "LLM_BASE_URL": provider_url,
        "LLM_MODEL": "fake-model",
        "ATMOSPHERE_DISPATCH__GRPC_HOST": "127.0.0.1",
        "ATMOSPHERE_DISPATCH__GRPC_PORT": str(grpc_port),
        "ATMOSPHERE_DISPATCH__MAX_CONCURRENT_RUNS": "32",
        # The built-in runtime's figures, whichever framework adapters are installed beside it.
        "ATMOSPHERE_DISPATCH__RUNTIME": "built-in",
    }
    names = os.environ.get("BENCH_SERVICES", "governance,tape,memory,dispatch").split(",")
    children = [subprocess.Popen([sys.executable, "-m", f"atmosphere.{name}"], env=env) for name in names]
    for child in children:
        pin(child.pid, SUT_CPUS)
    try:
        yield {name: child.pid for name, child in zip(names, children, strict=True)}
    finally:
        for child in children:
            child.terminate()
        for child in children:
            child.wait(15)


@contextlib.contextmanager
def fake_upstream() -> Iterator[str]:
    """The scripted provider in a process of its own, so it never competes with the clients."""
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
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        process.wait(10)


@contextlib.asynccontextmanager
async def system(
    scratch: Path,
) -> AsyncIterator[tuple[str, dispatch_pb2_grpc.DispatchServiceStub, dict[str, int]]]:
    """The provider URL, a stub on dispatch's gRPC port, and the pids of the system under test by name."""
    server = NatsServer(scratch / "nats").start()
    pin(server.pid, SUT_CPUS)
    grpc_port = free_port()
    try:
        with (
            fake_upstream() as provider_url,
            processes(server.url, provider_url, scratch / "data", grpc_port) as services,
        ):
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                stub = dispatch_pb2_grpc.DispatchServiceStub(channel)
                deadline = time.monotonic() + 60
                while True:
                    try:
                        await grpc_stream(stub)
                        break
                    except (grpc.aio.AioRpcError, RuntimeError, AssertionError):
                        if time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.5)
                yield provider_url, stub, {**services, "nats-server": server.pid}
    finally:
        server.stop()


def report(concurrency: int, direct: ArmStats, via: ArmStats) -> dict[str, float]:
    def added(a: list[float], b: list[float]) -> float:
        return statistics.median(y - x for x, y in zip(a, b, strict=True))

    result = {
        "ttft_p50": added(direct.ttft_p50, via.ttft_p50),
        "ttft_p99": added(direct.ttft_p99, via.ttft_p99),
        "token_p50": added(direct.token_p50, via.token_p50),
        "token_p99": added(direct.token_p99, via.token_p99),
    }
    print(f"\n{concurrency} concurrent stream(s), median of {len(direct.ttft_p50)} rounds (ms)")
    print(f"  {'':24}{'TTFT p50':>10}{'TTFT p99':>10}{'token p50':>11}{'token p99':>11}")
    for arm in (direct, via):
        print(
            f"  {arm.name:<24}{statistics.median(arm.ttft_p50):10.2f}{statistics.median(arm.ttft_p99):10.2f}"
            f"{statistics.median(arm.token_p50):11.3f}{statistics.median(arm.token_p99):11.3f}"
        )
    print(
        f"  {'added by dispatch':<24}{result['ttft_p50']:+10.2f}{result['ttft_p99']:+10.2f}"
        f"{result['token_p50']:+11.3f}{result['token_p99']:+11.3f}"
    )
    return result


async def main(rounds: int, streams: int) -> int:
    with tempfile.TemporaryDirectory() as scratch:
        async with (
            system(Path(scratch)) as (provider_url, stub, sut),
            httpx.AsyncClient(limits=httpx.Limits(max_connections=64)) as client,
        ):
            results: dict[int, dict[str, float]] = {}
            for concurrency in (1, 16):
                direct, via = ArmStats("provider directly"), ArmStats("gRPC Run via dispatch")
                # Only the gRPC arm goes through the system under test, so only its blocks are metered.
                meter = CpuMeter(sut)
                arms: list[tuple[ArmStats, Callable[[], Awaitable[Sample]], CpuMeter | None]] = [
                    (direct, lambda: direct_stream(client, provider_url), None),
                    (via, lambda: grpc_stream(stub), meter),
                ]
                for index in range(rounds + 1):  # the first round warms up and is discarded
                    random.shuffle(arms)
                    for stats, run_one, metered in arms:
                        samples = await metered_block(
                            run_one, concurrency, max(streams, concurrency), metered, keep=index > 0
                        )
                        if index:
                            stats.add(samples)
                results[concurrency] = report(concurrency, direct, via)
                print(f"  {meter.line()}")
    at16 = results[16]
    print(
        f"\ntargets at 16 streams: added TTFT p50 <= 3 ms: {'PASS' if at16['ttft_p50'] <= 3 else 'FAIL'}"
        f" ({at16['ttft_p50']:+.2f}); added per-token p50 <= 0.5 ms:"
        f" {'PASS' if at16['token_p50'] <= 0.5 else 'FAIL'} ({at16['token_p50']:+.3f})"
    )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--streams", type=int, default=32, help="streams per arm per round")
    parser.add_argument("--no-pin", action="store_true", help="do not pin the SUT and the load to separate CPUs")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if not args.no_pin and len(cpus) >= 2:
        SUT_CPUS.add(cpus[0])
        LOAD_CPUS.add(cpus[1])
        pin(0, LOAD_CPUS)
        print(f"system under test on CPU {cpus[0]}; load generator and upstream on CPU {cpus[1]}")
    # The clients of both arms run on the same loop as the services do (uvloop when installed).
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        raise SystemExit(runner.run(main(args.rounds, args.streams)))
