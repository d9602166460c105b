"""Runs survive a missing worker and a broker crash."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import websockets

from atmosphere.bus import NatsBus, connect, subjects
from atmosphere.contracts.run.v1.run_pb2 import RunSubmission
from atmosphere.contracts.tape.v1.tape_pb2 import GetStepsRequest, GetStepsResponse
from atmosphere.dispatch.app import run_queues
from atmosphere.dispatch.settings import DispatchOptions
from atmosphere.testing import NatsServer, run_stack, running_service, wait_until

from .conftest import service_map
from .wsclient import ask, read_run, ws_url


async def test_a_run_submitted_without_workers_runs_once_a_worker_starts(
    services: dict[str, Any], nats_bus: NatsBus
) -> None:
    dispatch = services.pop("dispatch")
    async with run_stack(services, bus=nats_bus) as stack:
        # A dispatch that ran before registered the agent, then went away.
        async with running_service("dispatch", *dispatch, bus=nats_bus):
            pass
        async with websockets.connect(ws_url(await stack.ingress_url(), "echo")) as ws:
            await ws.send("queued while nobody works")
            accepted = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert accepted["key"] == "X-Atmosphere-Run-Id"
            run_id = accepted["value"]
            # Nothing happens without a worker...
            with contextlib.suppress(TimeoutError):
                unexpected = await asyncio.wait_for(ws.recv(), 1.0)
                raise AssertionError(f"a frame arrived with no worker running: {unexpected}")
            # ...and the run executes, once, when one starts.
            async with running_service("dispatch", *dispatch, bus=nats_bus):
                rest = await read_run(ws)
        assert [f["seq"] for f in rest] == list(range(2, len(rest) + 2))
        assert "".join(f["data"] for f in rest if f["type"] == "streaming-text") == "queued while nobody works"

        async def recorded_once() -> bool:
            steps = await nats_bus.request(subjects.tape("steps"), GetStepsRequest(run_id=run_id), GetStepsResponse)
            return steps.run.status == "COMPLETED"

        await wait_until(recorded_once, what="the tape to see the run complete")
        steps = await nats_bus.request(subjects.tape("steps"), GetStepsRequest(run_id=run_id), GetStepsResponse)
        assert [s.kind for s in steps.steps] == ["metadata", "text", "complete"]  # the text coalesced
        assert [s.seq for s in steps.steps] == [1, rest[0]["seq"], rest[-1]["seq"]]

    # The work queue is empty: nothing is left to run a second time.
    leftovers: list[str] = []

    async def collect(item: Any) -> None:
        leftovers.append(item.envelope.message.run_id)

    async with contextlib.AsyncExitStack() as queues:
        for spec in run_queues(DispatchOptions()):  # as the stack's dispatch provisioned them
            await queues.enter_async_context(nats_bus.consume(spec, RunSubmission, collect))
        await asyncio.sleep(1.0)
    assert leftovers == []


async def test_services_reconnect_after_the_broker_restarts(fresh_nats: NatsServer, tmp_path: Path) -> None:
    async with connect(fresh_nats.url, name="test", namespace="crash") as bus:
        services = service_map(fresh_nats.url, "crash", tmp_path / "data")
        async with run_stack(services, bus=bus) as stack:
            url = await stack.ingress_url()
            assert (await ask(url, "echo", "before the crash"))[-1]["type"] == "complete"

            fresh_nats.kill()
            await asyncio.sleep(0.5)
            fresh_nats.start()

            async def answers() -> bool:
                try:
                    frames = await ask(url, "echo", "after the crash")
                except (OSError, TimeoutError, websockets.WebSocketException):
                    return False
                return (
                    frames[-1]["type"] == "complete"
                    and "".join(f["data"] for f in frames if f["type"] == "streaming-text") == "after the crash"
                )

            await wait_until(answers, timeout=30, interval=0.5, what="a run to succeed after the restart")
