"""A dispatch service in a process of its own, as a test starts, kills and restarts it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

from atmosphere.testing import wait_until

from .conftest import ROOT


@dataclass
class Worker:
    """One dispatch process, restartable."""

    env: dict[str, str]
    log_dir: Path
    process: asyncio.subprocess.Process | None = None
    ready: bool = False
    starts: int = 0
    grpc_target: str = ""
    restarting: asyncio.Task[None] | None = None
    """The restart under way after a kill: `stop()` ends it too, so no dispatch outlives the test."""
    ready_timeout: float = 60.0
    """Seconds a start may take (a safety net: an app importing heavy frameworks starts slower)."""
    python: str = sys.executable
    """Its interpreter: another environment's for a pool of the pinned adapters (`.venvs/pinned`)."""

    async def start(self) -> None:
        self.starts += 1
        log = self.log_dir / f"dispatch-{id(self)}-{self.starts}.log"
        self.ready = False
        with log.open("wb") as sink:
            self.process = await asyncio.create_subprocess_exec(
                self.python, "-m", "atmosphere.dispatch", env=self.env, stdout=sink, stderr=sink, cwd=ROOT
            )
        port = await _logged_port(log, self.process, r"probes on http://[\d.]+:(\d+)/readyz", self.ready_timeout)
        async with httpx.AsyncClient() as client:

            async def up() -> bool:
                with contextlib.suppress(httpx.HTTPError):
                    return (await client.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200
                return False

            await wait_until(up, timeout=self.ready_timeout, interval=0.1, what="a dispatch process to be ready")
        grpc_port = await _logged_port(log, self.process, r"gRPC DispatchService on [\d.]+:(\d+)", self.ready_timeout)
        self.grpc_target = f"127.0.0.1:{grpc_port}"
        self.ready = True

    def kill(self) -> int:
        assert self.process is not None
        self.ready = False
        self.process.send_signal(signal.SIGKILL)
        return self.process.pid

    async def stop(self) -> None:
        if self.restarting is not None and not self.restarting.done():
            self.restarting.cancel()
            with contextlib.suppress(asyncio.CancelledError, AssertionError):
                await self.restarting
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
            await self.process.wait()


async def _logged_port(log: Path, process: asyncio.subprocess.Process, pattern: str, timeout: float) -> int:
    found: list[int] = []

    async def logged() -> bool:
        if process.returncode is not None:
            raise AssertionError(f"dispatch exited: {log.read_text(errors='replace')[-2000:]}")
        match = re.search(pattern, log.read_text(errors="replace"))
        if match:
            found.append(int(match.group(1)))
        return bool(found)

    await wait_until(logged, timeout=timeout, interval=0.1, what=f"dispatch to log {pattern}")
    return found[0]


def worker_env(
    nats_url: str, namespace: str, data: Path, *, app: str, provider_url: str, durable: bool, **extra: str
) -> dict[str, str]:
    """The environment of a dispatch worker process of the test's stack (`extra`: more variables)."""
    return {
        **os.environ,
        "ATMOSPHERE_NATS__URL": nats_url,
        "ATMOSPHERE_NATS__NAMESPACE": namespace,
        "ATMOSPHERE_APP": app,
        "ATMOSPHERE_APP_DIR": str(ROOT),
        "ATMOSPHERE_DATA_DIR": str(data),
        "ATMOSPHERE_PROBE_HOST": "127.0.0.1",
        "ATMOSPHERE_PROBE_PORT": "0",
        "ATMOSPHERE_DISPATCH__GRPC_HOST": "127.0.0.1",
        "ATMOSPHERE_DISPATCH__GRPC_PORT": "0",
        "ATMOSPHERE_DURABLE_RUNS_ENABLED": "true" if durable else "false",
        "LLM_BASE_URL": provider_url,
        "LLM_MODEL": "fake-model",
        "PYTHONPATH": str(ROOT),
        **extra,
    }
