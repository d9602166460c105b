"""A real ingress process on SIGTERM waits out its removal from the endpoints before it stops accepting.

Kubernetes signals a stopping pod and takes it out of its Service's endpoints at the same time;
proxies hear of that seconds later and still send it new clients meanwhile. With
`ATMOSPHERE_INGRESS__PRE_STOP_DELAY` ingress first goes on serving for that long, new
connections included, with `/readyz` answering 503; only then does its listener close (it drains
and exits 0). Every request below opens a connection of its own.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

from atmosphere.testing import free_port, wait_until

from .conftest import ROOT

pytestmark = pytest.mark.timeout(90)

PRE_STOP_DELAY = 6.0
"""Long enough for the checks below to land inside it on a loaded machine; the test waits it out once."""


async def status(url: str) -> int | None:
    """The status of GET `url` on a new connection; None when nothing accepts it."""
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            return (await http.get(url)).status_code
    except httpx.ConnectError:
        return None


async def test_sigterm_keeps_serving_not_ready_for_the_pre_stop_delay_then_closes_the_port(
    nats_url: str, bus_namespace: str, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("ATMOSPHERE_", "LLM_"))},
        "ATMOSPHERE_NATS__URL": nats_url,
        "ATMOSPHERE_NATS__NAMESPACE": bus_namespace,
        "ATMOSPHERE_DATA_DIR": str(tmp_path / "ingress"),
        "ATMOSPHERE_INGRESS__PORT": str(port),
        "ATMOSPHERE_INGRESS__PRE_STOP_DELAY": str(PRE_STOP_DELAY),
        "ATMOSPHERE_INGRESS__DRAIN_GRACE": "5",
    }
    log = tmp_path / "ingress.log"
    with log.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "atmosphere.ingress", env=env, cwd=ROOT, stdout=sink, stderr=sink
        )
    base = f"http://127.0.0.1:{port}"
    try:

        async def ready() -> bool:
            assert process.returncode is None, log.read_text()
            return await status(f"{base}/readyz") == 200

        await wait_until(ready, timeout=60, interval=0.1, what="ingress to be ready")
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)

        # Not ready from now on, for the load balancers; the port still accepts and serves.
        async def not_ready() -> bool:
            found = await status(f"{base}/readyz")
            assert found is not None, f"the port closed before the pre-stop delay was over:\n{log.read_text()}"
            return found == 503

        await wait_until(not_ready, timeout=PRE_STOP_DELAY, interval=0.05, what="/readyz to answer 503")
        assert await status(f"{base}/healthz") == 200
        assert await status(f"{base}/openapi.json") == 200

        # Then the listener closes, and the process drains and exits cleanly.
        async def closed() -> bool:
            return await status(f"{base}/healthz") is None

        await wait_until(closed, timeout=PRE_STOP_DELAY + 30, interval=0.1, what="the port to close")
        assert time.monotonic() - signalled >= PRE_STOP_DELAY
        assert await asyncio.wait_for(process.wait(), 30) == 0, log.read_text()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert "pre-stop delay" in log.read_text()
