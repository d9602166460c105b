"""Ingress's memory under floods of large headers, large bodies and slow clients (loopback only).

Starts a nats-server and one ingress process (no other service: every flood is refused before a
run would be submitted; an `echo` agent descriptor is written to `ATMO_AGENTS` so that prompt
routes reach their body check). Then, one phase after another, many concurrent clients send:

  headers      64 MiB of one header line, until answered (431)
  request-line 64 MiB of request line, until answered (414)
  declared     a POST declaring a 100 MB body, then sending it (413 from the headers alone)
  chunked      a chunked POST streaming 100 MB, until answered (413 once 1 MiB was read)
  unauthorized an approval POST without a token declaring 100 MB (401 before any body is read)
  slowloris    hundreds of connections trickling their headers a byte at a time (408)

Printed per phase: what the clients got, how many bytes they managed to send, and ingress's RSS
(`/proc/<pid>/status` VmRSS) before, at its peak (sampled every 20 ms) and after. Not a timed
test: the numbers are for the closing note of issue 8.

    .venv/bin/python bench/ingress_flood.py [--clients 16] [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from atmosphere.bus import JetStreamLayout, connect, subjects
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.testing import NatsServer, free_port

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
BLOCK = b"a" * 65536
TOKEN = "flood-token-123456"


def rss_kib(pid: int) -> int:
    """The process's resident set (KiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@dataclass
class Sampler:
    """Ingress's peak RSS while a phase runs."""

    pid: int
    peak: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        self.peak = rss_kib(self.pid)
        self._stop.clear()
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        try:
            yield
        finally:
            self._stop.set()
            thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_kib(self.pid))


# -- clients ---------------------------------------------------------------------------------------


def _status(head: bytes) -> str:
    parts = head.split(b" ", 2)
    return parts[1].decode() if len(parts) > 1 else "?"


async def flood_one(port: int, head: bytes, filler: Callable[[], bytes], total: int) -> tuple[str, int]:
    """Send `head`, then filler up to `total` bytes unless answered first; (status, bytes sent)."""
    sent = 0
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as exc:
        return f"connect:{type(exc).__name__}", 0
    answer = asyncio.create_task(reader.read(65536))
    try:
        writer.write(head)
        sent += len(head)
        while sent < total and not answer.done():
            chunk = filler()
            writer.write(chunk)
            sent += len(chunk)
            await writer.drain()
        data = await asyncio.wait_for(answer, 30)
        return (_status(data) if data else "closed"), sent
    except (ConnectionError, TimeoutError) as exc:
        if answer.done() and not answer.cancelled() and answer.exception() is None and answer.result():
            return _status(answer.result()), sent
        return type(exc).__name__, sent
    finally:
        answer.cancel()
        with contextlib.suppress(Exception):
            writer.close()
            await writer.wait_closed()


async def trickle_one(port: int, request: bytes, pause: float) -> tuple[str, int]:
    """Send `request` a byte at a time, `pause` apart, until answered; (status, bytes sent)."""
    sent = 0
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answer = asyncio.create_task(reader.read(65536))
    try:
        for byte in request:
            if answer.done():
                break
            writer.write(bytes([byte]))
            sent += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(answer), pause)
        data = await asyncio.wait_for(answer, 30)
        return (_status(data) if data else "closed"), sent
    except (ConnectionError, TimeoutError) as exc:
        return type(exc).__name__, sent
    finally:
        answer.cancel()
        with contextlib.suppress(Exception):
            writer.close()
            await writer.wait_closed()


def _chunk() -> bytes:
    return b"10000\r\n" + BLOCK + b"\r\n"


def _block() -> bytes:
    return BLOCK


Client = Callable[[], Coroutine[Any, Any, tuple[str, int]]]


def phases(port: int, clients: int) -> dict[str, list[Client]]:
    """Each phase's clients (each a coroutine function: one connection, one hostile request)."""
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    post = b"POST /atmosphere/agent/echo HTTP/1.1\r\nHost: x\r\n" + auth

    def many(make: Client, count: int = clients) -> list[Client]:
        return [make] * count

    return {
        "headers": many(lambda: flood_one(port, b"GET /readyz HTTP/1.1\r\nHost: x\r\nX-Big: ", _block, 64 * MiB)),
        "request-line": many(lambda: flood_one(port, b"GET /", _block, 64 * MiB)),
        "declared": many(lambda: flood_one(port, post + b"Content-Length: 100000000\r\n\r\n", _block, 100 * MiB)),
        "chunked": many(lambda: flood_one(port, post + b"Transfer-Encoding: chunked\r\n\r\n", _chunk, 100 * MiB)),
        "unauthorized": many(
            lambda: flood_one(
                port,
                b"POST /atmosphere/runs/r1/approval HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n",
                _block,
                100 * MiB,
            )
        ),
        "slowloris": many(
            lambda: trickle_one(port, b"GET /readyz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 64 + b"\r\n\r\n", 0.2),
            count=clients * 20,
        ),
    }


# -- the system ------------------------------------------------------------------------------------


@contextlib.contextmanager
def ingress_process(nats_url: str, namespace: str, data: Path, port: int) -> Iterator[int]:
    env = {
        **os.environ,
        "ATMOSPHERE_NATS__URL": nats_url,
        "ATMOSPHERE_NATS__NAMESPACE": namespace,
        "ATMOSPHERE_DATA_DIR": str(data),
        "ATMOSPHERE_LOG__LEVEL": "ERROR",
        "ATMOSPHERE_PROBE_PORT": "0",
        "ATMOSPHERE_INGRESS__HOST": "127.0.0.1",
        "ATMOSPHERE_INGRESS__PORT": str(port),
        "ATMOSPHERE_INGRESS__AUTH_TOKENS": f'[{{"token": "{TOKEN}", "user_id": "flood"}}]',
        "ATMOSPHERE_INGRESS__HEADER_TIMEOUT": "2",
    }
    child = subprocess.Popen([sys.executable, "-m", "atmosphere.ingress"], env=env, cwd=ROOT)
    try:
        yield child.pid
    finally:
        child.terminate()
        try:
            child.wait(15)
        except subprocess.TimeoutExpired:
            child.kill()


async def wait_ready(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=2) as http:
        for _ in range(300):
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get("/readyz")).status_code == 200:
                    return
            await asyncio.sleep(0.1)
    msg = "ingress did not become ready"
    raise RuntimeError(msg)


async def register_echo(nats_url: str, namespace: str) -> None:
    """Make `/atmosphere/agent/echo` known, as a dispatch would, so prompts reach their body check."""
    async with connect(nats_url, name="flood", namespace=namespace) as bus:
        await bus.provision(JetStreamLayout())
        descriptor = AgentDescriptor(name="echo", path="/atmosphere/agent/echo")
        await bus.kv_put(subjects.AGENTS_BUCKET, "echo", descriptor)


async def run(clients: int, rounds: int) -> int:
    with tempfile.TemporaryDirectory(prefix="atmo-flood-") as tmp:
        server = NatsServer(Path(tmp) / "nats").start()
        namespace = "flood"
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        try:
            await register_echo(server.url, namespace)
            with ingress_process(server.url, namespace, Path(tmp) / "data", port) as pid:
                await wait_ready(url)
                start = rss_kib(pid)
                print(f"ingress pid {pid}: RSS {start / 1024:.1f} MiB after start ({clients} clients per phase)")
                print(f"{'phase':<13} {'answers':<34} {'sent/client':>12} {'RSS before':>11} {'peak':>8} {'after':>8}")
                sampler = Sampler(pid)
                for name, makers in phases(port, clients).items():
                    before = rss_kib(pid)
                    answers: collections.Counter[str] = collections.Counter()
                    sent = 0
                    with sampler.watching():
                        for _ in range(rounds):
                            results = await asyncio.gather(*(make() for make in makers))
                            answers.update(status for status, _ in results)
                            sent += sum(n for _, n in results)
                    await asyncio.sleep(0.5)
                    after = rss_kib(pid)
                    per_client = sent / (len(makers) * rounds) / MiB
                    summary = ", ".join(f"{k}x{v}" for k, v in answers.most_common())
                    print(
                        f"{name:<13} {summary:<34} {per_client:>9.2f} MiB {before / 1024:>8.1f} MiB"
                        f" {sampler.peak / 1024:>5.1f} MiB {after / 1024:>5.1f} MiB"
                    )
                end = rss_kib(pid)
                async with httpx.AsyncClient(base_url=url, timeout=5) as http:
                    ready = (await http.get("/readyz")).status_code
                print(
                    f"ingress RSS {start / 1024:.1f} MiB before the floods, {end / 1024:.1f} MiB after; /readyz {ready}"
                )
                return 0 if ready == 200 else 1
        finally:
            server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients per phase (slowloris: 20x)")
    parser.add_argument("--rounds", type=int, default=4, help="times each phase's clients run")
    args = parser.parse_args()
    started = time.monotonic()
    status = asyncio.run(run(args.clients, args.rounds))
    print(f"done in {time.monotonic() - started:.0f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
