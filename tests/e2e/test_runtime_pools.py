"""Runtime pools through real processes: killing one pool's dispatch leaves every other pool answering.

The default pool's dispatch runs in this process with the other services; the `built-in`
pool's dispatch is a process of its own, SIGKILLed mid-test. Its agent's prompts then wait in
its queue and are answered when it is back; once its descriptors expire, ingress refuses its
agent up front instead of queueing prompts nobody will take.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import websockets

from atmosphere.bus import NatsBus
from atmosphere.config import JetStreamSettings
from atmosphere.dispatch.settings import DispatchOptions
from atmosphere.ingress.agent_socket import CLOSE_UNKNOWN
from atmosphere.testing import ScriptedModel, Turn, run_stack, wait_until

from .conftest import service_map
from .dispatch_process import Worker, worker_env
from .wsclient import ask, read_run, ws_url

pytestmark = pytest.mark.timeout(180)

APP = "tests.e2e.apps.pools_app:app"
AGENTS_MAX_AGE = 3.0
"""Seconds an agent's descriptor outlives the last dispatch serving it (30 by default)."""


def answer(_request: Any) -> Turn:
    return Turn.text("Answered by the model.")


def text(frames: list[dict[str, Any]]) -> str:
    return "".join(f["data"] for f in frames if f.get("type") == "streaming-text")


def with_short_lived_agents(services: dict[str, tuple[Any, Any]]) -> dict[str, tuple[Any, Any]]:
    jetstream = JetStreamSettings(agents_max_age=AGENTS_MAX_AGE)
    return {name: (serve, s.model_copy(update={"jetstream": jetstream})) for name, (serve, s) in services.items()}


async def test_killing_one_pool_leaves_the_others_answering(
    nats_url: str, bus_namespace: str, nats_bus: NatsBus, tmp_path: Path
) -> None:
    provider = ScriptedModel(function=answer)
    async with provider.serving():
        services = with_short_lived_agents(
            service_map(
                nats_url,
                bus_namespace,
                tmp_path / "data",
                app=APP,
                llm_base_url=provider.base_url,
                dispatch={"dispatch": _default_pool()},
            )
        )
        env = worker_env(
            nats_url,
            bus_namespace,
            tmp_path / "data",
            app=APP,
            provider_url=provider.base_url,
            durable=False,
            ATMOSPHERE_DISPATCH__POOL="built-in",
            ATMOSPHERE_JETSTREAM__AGENTS_MAX_AGE=str(AGENTS_MAX_AGE),
        )
        pool = Worker(env, tmp_path)
        async with run_stack(services, bus=nats_bus) as stack:
            url = await stack.ingress_url()
            try:
                await pool.start()
                for agent in ("plain", "pinned"):
                    frames = await ask(url, agent, "hello")
                    assert frames[-1]["type"] == "complete", (agent, frames)
                    assert text(frames) == "Answered by the model."

                pool.kill()
                assert pool.process is not None
                await pool.process.wait()
                # The default pool does not notice.
                assert (await ask(url, "plain", "still there?"))[-1]["type"] == "complete"

                # A prompt for the dead pool's agent waits in its queue (its descriptor lives on
                # for a few seconds), and is answered once the pool is back.
                async with websockets.connect(ws_url(url, "pinned")) as ws:
                    await ws.send("are you back?")
                    accepted = json.loads(await asyncio.wait_for(ws.recv(), 10))
                    assert accepted["key"] == "X-Atmosphere-Run-Id"
                    await pool.start()
                    rest = await read_run(ws, timeout=30)
                assert rest[-1]["type"] == "complete"
                assert text(rest) == "Answered by the model."

                # Killed again and left down: once its descriptor expired, its agent is refused up
                # front, while the default pool's keeps answering.
                pool.kill()
                await pool.process.wait()

                async def refused() -> bool:
                    async with websockets.connect(ws_url(url, "pinned")) as ws:
                        with contextlib.suppress(TimeoutError, websockets.ConnectionClosed):
                            await asyncio.wait_for(ws.recv(), 0.5)
                        return ws.close_code == CLOSE_UNKNOWN

                await wait_until(refused, timeout=AGENTS_MAX_AGE * 5, interval=0.2, what="pinned to be refused")
                async with websockets.connect(ws_url(url, "pinned")) as ws:
                    with pytest.raises(websockets.ConnectionClosed):
                        await asyncio.wait_for(ws.recv(), 5)
                    assert (ws.close_code, ws.close_reason) == (CLOSE_UNKNOWN, "Unknown agent 'pinned'")
                assert (await ask(url, "plain", "and now?"))[-1]["type"] == "complete"
            finally:
                await pool.stop()


def _default_pool() -> DispatchOptions:
    # The default pool's dispatch makes (without a login) every pool's queue, as the provisioner would.
    return DispatchOptions(grpc_host="127.0.0.1", grpc_port=0, runtime="built-in", pools=("built-in",))
