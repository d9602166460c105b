"""A run's fixed cost and a token's marginal cost, measured apart, beside LiteLLM's.

The system under test and the clients are `ingress_overhead.py`'s (real processes: nats-server,
ingress, dispatch, tape, governance, memory; the OpenAI endpoint and the WebSocket; LiteLLM in
front of the same upstream). The stack is started twice, behind an upstream that streams
answers of 10 tokens and then of 200 tokens (10 ms apart), then of 200 tokens 1 ms apart (a fast model, whose
deltas dispatch joins: `ATMOSPHERE_DISPATCH__TEXT_DELTA_WINDOW_MS`). At one concurrency (16 by default)
each arm streams blocks of completions in interleaved rounds, the first discarded. With C(n) the
CPU one stream of n tokens costs a process (user + system, from /proc), a token's marginal cost
is (C(200) - C(10)) / 190 and a run's fixed cost C(10) - 10 x marginal: per process and in all,
and the same for LiteLLM's process tree.

The broker's own counters (its monitoring endpoint) split the same way: the messages published
to it (`/varz` `in_msgs`) and the JetStream stores (the growth of every stream's last sequence,
`/jsz`), per run and per token.

Then one WebSocket conversation of 200 turns (10 tokens each): the stack's CPU per turn over
turns 3-22 and over turns 181-200, whose ratio says whether a turn's cost stays flat as the
conversation grows (the issue's target: within 20 %).

Targets (issue 30; reported, never asserted): marginal CPU per token <= 150 µs; CPU per run <= 1/4
of LiteLLM's per request; the long conversation's turn within 20 % of the short one's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import random
import sys
import tempfile
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ingress_overhead as io  # the same processes, clients and pinning
from _cpu import cpu_seconds

from atmosphere.service import loop_factory
from atmosphere.testing import NatsServer, free_port

SHORT, LONG = 10, 200
TOKEN_GAP = 0.01
"""Seconds between an answer's tokens: a model of about 100 tokens a second."""
FAST_GAP = 0.001
"""The fast model's: 1,000 tokens a second, faster than a 5 ms window (dispatch joins its deltas)."""
CONVERSATION_TURNS = 200
EARLY, LATE = range(2, 22), range(CONVERSATION_TURNS - 20, CONVERSATION_TURNS)
"""The turns (0-based) whose CPU is compared: 3-22 and 181-200 (20 each, back to back: a turn is a few
ms of CPU, and the background work of the stack during a window weighs on fewer)."""
OURS = (io.OPENAI, io.WEBSOCKET)


@dataclass
class Broker:
    """nats-server's own counters, read from its monitoring port."""

    url: str

    def _get(self, path: str) -> dict[str, object]:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=10) as answer:
            value: dict[str, object] = json.load(answer)
            return value

    def counters(self) -> tuple[int, int]:
        """(messages published to the server, messages stored by JetStream so far)."""
        published = int(str(self._get("/varz")["in_msgs"]))
        stored = 0
        details = self._get("/jsz?accounts=true&streams=true").get("account_details") or []
        assert isinstance(details, list)
        for account in details:
            for stream in account.get("stream_detail") or []:
                stored += int(stream["state"]["last_seq"])
        return published, stored


@dataclass
class Cost:
    """What an arm spent over its kept blocks at one answer length."""

    streams: int = 0
    tokens: int = 0
    cpu: Counter[str] = field(default_factory=Counter)
    """CPU seconds by process."""
    published: int = 0
    stored: int = 0
    errors: Counter[str] = field(default_factory=Counter)

    def per_stream(self, name: str | None = None) -> float:
        """CPU µs per stream of one process (or of all)."""
        spent = sum(self.cpu.values()) if name is None else self.cpu[name]
        return spent / self.streams * 1e6 if self.streams else float("nan")


async def arms_at(
    length: int, rounds: int, streams: int, concurrency: int, litellm: Path | None, gap: float = TOKEN_GAP
) -> dict[str, Cost]:
    """The stack and LiteLLM behind an upstream of `length`-token answers `gap` seconds apart: each arm's cost."""
    io.TOKENS = length  # read by the upstream's command line and by every client's check
    io.TOKEN_GAP = gap
    costs: dict[str, Cost] = {}
    rng = random.Random(length)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        monitor = free_port()
        nats = NatsServer(scratch / "nats", extra_args=("-m", str(monitor))).start()
        io.pin(nats.pid, io.SUT_CPUS)
        broker = Broker(f"http://127.0.0.1:{monitor}")
        http_port = free_port()
        base = f"http://127.0.0.1:{http_port}"
        try:
            with (
                io.fake_upstream() as (upstream, _),
                io.our_services(nats.url, upstream, scratch / "data", http_port) as ours,
            ):
                async with (
                    httpx.AsyncClient(timeout=10) as client,
                    io.litellm_arm(litellm, upstream, scratch, client) as lite,
                ):
                    sut = {"nats-server": nats.pid, **ours}
                    pool = io.HttpPool.of(base)
                    socket_url = f"ws://127.0.0.1:{http_port}/atmosphere/agent/assistant"
                    arms = [
                        io.Arm(
                            io.OPENAI,
                            lambda _: io.sse_stream(pool, "/atmosphere/v1/chat/completions", "assistant"),
                            sut,
                        ),
                        io.Arm(io.WEBSOCKET, lambda _: io.ws_stream(socket_url), sut),
                    ]
                    if lite is not None:
                        arms.append(lite)

                    async def ready() -> None:
                        assert (await client.get(f"{base}/readyz")).status_code == 200

                    await io.wait_ready(base, ready, "ingress")
                    for arm in arms:
                        await io.wait_ready(arm.name, functools.partial(arm.run_one, 0), arm.name)
                    for pid in sut.values():
                        io.pin(pid, io.SUT_CPUS)
                    costs = await measure(arms, rounds, streams, concurrency, broker, rng)
                    if length == SHORT and gap == TOKEN_GAP:
                        costs["conversation"] = await conversation(socket_url, sut)
                    pool.close()
        finally:
            nats.stop()
    return costs


async def measure(
    arms: list[io.Arm], rounds: int, streams: int, concurrency: int, broker: Broker, rng: random.Random
) -> dict[str, Cost]:
    costs = {arm.name: Cost() for arm in arms}
    size = io.block_size(concurrency, streams)
    for index in range(rounds + 1):  # the first round warms up and is discarded
        order = list(arms)
        rng.shuffle(order)
        for arm in order:
            errors: Counter[str] = Counter()
            cpu, counted = arm.cpu(), broker.counters()
            samples = await io.block(arm, concurrency, size, errors)
            await asyncio.sleep(io.SETTLE)
            used, after = arm.cpu(), broker.counters()
            if not index:
                continue
            cost = costs[arm.name]
            cost.streams += len(samples)
            cost.tokens += sum(len(sample.token_ms) for sample in samples)
            cost.errors.update(errors)
            for name, spent in used.items():
                cost.cpu[name] += spent - cpu[name]
            if arm.name in OURS:
                cost.published += after[0] - counted[0]
                cost.stored += after[1] - counted[1]
    return costs


async def conversation(url: str, sut: dict[str, int]) -> Cost:
    """One socket, 200 turns in a row: the stack's CPU over the early turns (in `cpu['early']`) and the late.

    Each window's turns follow one another with no pause (a pause between turns would weigh the
    stack's background work, its polls and sweeps, against the turns), and the window ends once
    the tape and memory finished its last turn's writes.
    """
    cost = Cost()
    roots = list(sut.values())
    started = 0.0
    async with websockets.connect(url, compression=None, max_size=None, open_timeout=30) as ws:
        for turn in range(CONVERSATION_TURNS):
            if turn in (EARLY.start, LATE.start):
                await asyncio.sleep(io.SETTLE)  # the turns before the window are not in it
                started = cpu_seconds(roots)
            await ws.send("go")
            while True:
                frame = json.loads(await asyncio.wait_for(ws.recv(), io.STREAM_TIMEOUT))
                if frame.get("type") == "error":
                    raise io.StreamError(f"turn {turn + 1}: {frame.get('code')}: {str(frame.get('data'))[:140]}")
                if frame.get("type") == "complete" and frame.get("seq", 0) > 0:
                    break
            for window, turns in (("early", EARLY), ("late", LATE)):
                if turn == turns.stop - 1:
                    await asyncio.sleep(io.SETTLE)  # the tape and memory finish the window's writes
                    cost.cpu[window] = cpu_seconds(roots) - started
    cost.streams = CONVERSATION_TURNS
    return cost


def split(short: Cost, long: Cost) -> tuple[dict[str, float], dict[str, float]]:
    """(fixed µs per run, marginal µs per token) by process, and in all under ''."""
    fixed: dict[str, float] = {}
    marginal: dict[str, float] = {}
    for name in [*short.cpu, ""]:
        key = name or None
        per_token = (long.per_stream(key) - short.per_stream(key)) / (LONG - SHORT)
        marginal[name] = per_token
        fixed[name] = short.per_stream(key) - SHORT * per_token
    return fixed, marginal


def bus_split(short: Cost, long: Cost, counted: str) -> tuple[float, float]:
    """(per run, per token) of a broker counter (`published` or `stored`), split as `split` splits CPU."""
    at_short = getattr(short, counted) / short.streams
    per_token = (getattr(long, counted) / long.streams - at_short) / (LONG - SHORT)
    return at_short - SHORT * per_token, per_token


def measured(name: str, *arms: dict[str, Cost]) -> bool:
    """Whether `name` streamed in every one of `arms`."""
    return all(name in arm and arm[name].streams for arm in arms)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def report(short: dict[str, Cost], long: dict[str, Cost], concurrency: int) -> None:
    print(f"\n{concurrency} concurrent streams; answers of {SHORT} and {LONG} tokens (µs of CPU)")
    print(
        f"  {'':28}{'per run':>10}{'per token':>11}{'run @10':>10}{'run @200':>10}   by process (per run / per token)"
    )
    runs: dict[str, float] = {}
    for name in [*OURS, io.LITELLM]:
        if not measured(name, short, long):
            continue
        fixed, marginal = split(short[name], long[name])
        runs[name] = fixed[""]
        parts = ", ".join(f"{p} {fixed[p]:.0f}/{marginal[p]:.0f}" for p in short[name].cpu)
        print(
            f"  {name:28}{fixed['']:>10.0f}{marginal['']:>11.1f}"
            f"{short[name].per_stream():>10.0f}{long[name].per_stream():>10.0f}   {parts}"
        )
    for name in OURS:
        if not measured(name, short, long):
            continue
        msgs_per_run, msgs_per_token = bus_split(short[name], long[name], "published")
        stores_per_run, stores_per_token = bus_split(short[name], long[name], "stored")
        print(
            f"  {name} on the bus: {msgs_per_run:.1f} messages and {stores_per_run:.1f} JetStream stores per run, "
            f"{msgs_per_token:.2f} and {stores_per_token:.2f} per token"
        )
    for name, cost in {**short, **long}.items():
        if cost.errors:
            print(f"  {name}: {cost.errors.total()} failed stream(s): {cost.errors.most_common(2)}")
    for name in OURS:
        if name in runs:
            _, marginal = split(short[name], long[name])
            print(f"  {name}: marginal CPU per token <= 150 µs: {verdict(marginal[''] <= 150)} ({marginal['']:.0f} µs)")
            if io.LITELLM in runs:
                share = runs[name] / runs[io.LITELLM]
                print(f"  {name}: CPU per run <= 1/4 of LiteLLM's per request: {verdict(share <= 0.25)} ({share:.2f}×)")


def report_fast(short: dict[str, Cost], fast: dict[str, Cost]) -> None:
    """A fast model's marginal cost per token: its 200-token answers against the 10-token ones."""
    print(f"\na fast model ({LONG} tokens {FAST_GAP * 1000:g} ms apart): marginal CPU per token (µs)")
    for name in [*OURS, io.LITELLM]:
        if not measured(name, short, fast):
            continue
        _, marginal = split(short[name], fast[name])
        parts = ", ".join(f"{p} {marginal[p]:.0f}" for p in short[name].cpu)
        line = f"  {name:28}{marginal['']:>11.1f}   {parts}"
        if name in OURS:
            line += f"; {bus_split(short[name], fast[name], 'published')[1]:.2f} bus messages per token"
        print(line)


def report_conversation(cost: Cost) -> None:
    early = cost.cpu["early"] / len(EARLY) * 1e6
    late = cost.cpu["late"] / len(LATE) * 1e6
    print(
        f"\none WebSocket conversation of {CONVERSATION_TURNS} turns ({SHORT} tokens each): stack CPU per turn "
        f"{early:.0f} µs at turns {EARLY.start + 1}-{EARLY.stop}, {late:.0f} µs at turns {LATE.start + 1}-{LATE.stop} "
        f"({late / early:.2f}×)"
    )
    print(f"  a long conversation's turn within 20 % of a short one's: {verdict(abs(late / early - 1) <= 0.2)}")


@contextlib.contextmanager
def pinned(no_pin: bool) -> Iterator[None]:
    cpus = sorted(os.sched_getaffinity(0))
    if not no_pin and len(cpus) >= 2:
        io.SUT_CPUS.add(cpus[0])
        io.LOAD_CPUS.add(cpus[1])
        io.pin(os.getpid(), io.LOAD_CPUS)
        print(f"system under test on CPU {cpus[0]}; load generator and upstream on CPU {cpus[1]}")
    yield


async def main(rounds: int, streams: int, concurrency: int, litellm: Path | None) -> int:
    short = await arms_at(SHORT, rounds, streams, concurrency, litellm)
    long = await arms_at(LONG, rounds, streams, concurrency, litellm)
    fast = await arms_at(LONG, rounds, streams, concurrency, litellm, gap=FAST_GAP)
    talk = short.pop("conversation")
    report(short, long, concurrency)
    report_fast(short, fast)
    report_conversation(talk)
    failed = sum(cost.errors.total() for costs in (short, long, fast) for name, cost in costs.items() if name in OURS)
    return 1 if failed else 0


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="kept rounds (one more warms up)")
    parser.add_argument("--streams", type=int, default=32, help="streams per arm per round")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--no-pin", action="store_true", help="do not pin the SUT and the load to separate CPUs")
    parser.add_argument("--skip-litellm", action="store_true", help="run without the LiteLLM arm")
    args = parser.parse_args(argv)
    with pinned(args.no_pin):
        command = None if args.skip_litellm else io.install_litellm()
        with asyncio.Runner(loop_factory=loop_factory()) as loop:
            return loop.run(main(args.rounds, args.streams, args.concurrency, command))


if __name__ == "__main__":
    raise SystemExit(run())
