"""The broker is killed (-9) and restarted under streaming runs: no accepted event is lost.

Eight clients stream slow answers over WebSocket while nats-server is killed and started
again on the same store, three times over. Every accepted run must end for its client with
one terminal frame and every word exactly once, and its event sequence must be complete,
exactly once, in `ATMO_EVENTS` and on the tape. A client behaves as a real one would: when
told the stream broke it resumes with the run id and its last seq; when told its prompt was
not started it sends it again.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import websockets

from atmosphere.bus import BusError, NatsBus, connect, subjects
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.contracts.tape.v1.tape_pb2 import GetStepsRequest, GetStepsResponse
from atmosphere.testing import NatsServer, run_stack, wait_until

from .conftest import service_map
from .wsclient import ws_url

WORDS = 300
PAUSE = 0.005
CLIENTS = 8
CYCLES = 3
EXPECTED_TEXT = "".join(f"w{n} " for n in range(WORDS))


@dataclass
class ClientRun:
    """What one client saw of its run, across resumes."""

    run_id: str = ""
    frames: list[dict[str, Any]] = field(default_factory=list)
    resumes: int = 0
    resubmits: int = 0
    notices: list[dict[str, Any]] = field(default_factory=list)
    """Ingress's own error frames (seq 0): a broken stream or a prompt that was not started."""

    @property
    def last_seq(self) -> int:
        return max((f["seq"] for f in self.frames if f.get("seq")), default=0)

    @property
    def terminal(self) -> dict[str, Any] | None:
        return next((f for f in self.frames if f.get("type") in {"complete", "error"} and f.get("seq")), None)


async def stream_one(url: str) -> ClientRun:
    """Send one prompt and follow its run to the end, resuming as often as needed."""
    run = ClientRun()
    while run.terminal is None:
        target = ws_url(url, "ticker")
        if run.run_id:
            target += f"?runId={run.run_id}&lastSeq={run.last_seq}"
        try:
            async with websockets.connect(target, open_timeout=10) as ws:
                if not run.run_id:
                    await ws.send(f"{WORDS} {PAUSE}")
                await _read(ws, run)
        except (OSError, TimeoutError, websockets.WebSocketException):
            await asyncio.sleep(0.2)  # ingress itself is fine; a real client retries anyway
    return run


async def _read(ws: websockets.ClientConnection, run: ClientRun) -> None:
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 60))
        if frame.get("seq", 0) == 0:  # ingress's own error frame: not part of the run
            run.notices.append(frame)
            if frame.get("runId"):
                run.resumes += 1
            else:
                run.resubmits += 1  # the prompt was not started: send it again, after a pause
                await asyncio.sleep(0.2)
            return
        if frame["type"] == "metadata" and frame.get("key") == "X-Atmosphere-Run-Id":
            run.run_id = frame["value"]
        if frame["seq"] > run.last_seq:
            run.frames.append(frame)
        if run.terminal is not None:
            return


async def break_the_broker(server: NatsServer) -> None:
    await asyncio.sleep(0.6)  # mid-answer: each answer takes about 2 s
    server.kill()
    await asyncio.sleep(1.0)
    server.start()


@pytest.mark.timeout(240)
async def test_no_accepted_event_is_lost_when_the_broker_is_killed_and_restarted(
    fresh_nats: NatsServer, tmp_path: Path
) -> None:
    async with connect(fresh_nats.url, name="test", namespace="kill9") as bus:
        services = service_map(fresh_nats.url, "kill9", tmp_path / "data", app="tests.e2e.apps.ticker:app")
        async with run_stack(services, bus=bus) as stack:
            url = await stack.ingress_url()
            runs: list[ClientRun] = []
            for _ in range(CYCLES):
                clients = [asyncio.create_task(stream_one(url)) for _ in range(CLIENTS)]
                await break_the_broker(fresh_nats)
                runs += await asyncio.wait_for(asyncio.gather(*clients), 120)
            print(  # the numbers for the closing note (pytest -s)
                f"runs={len(runs)} resumes={sum(r.resumes for r in runs)} resubmits={sum(r.resubmits for r in runs)}"
            )
            for run in runs:
                assert_seen_once(run)
                await assert_stored_once(bus, run)
            # The breaks did hit runs in flight (else this test proves nothing).
            assert sum(r.resumes for r in runs) + sum(1 for r in runs if r.frames) >= CLIENTS * CYCLES


def assert_seen_once(run: ClientRun) -> None:
    seqs = [f["seq"] for f in run.frames]
    assert seqs == list(range(1, len(seqs) + 1)), run.run_id
    assert run.terminal is not None
    assert run.terminal["type"] == "complete", run.terminal
    assert "".join(f["data"] for f in run.frames if f["type"] == "streaming-text") == EXPECTED_TEXT


async def assert_stored_once(bus: NatsBus, run: ClientRun) -> None:
    last = run.last_seq
    copies = sorted(
        [e.seq async for e in bus.replay(subjects.EVENTS_STREAM, subjects.run_events(run.run_id), RunEvent)]
    )
    assert copies == list(range(1, last + 1)), f"run {run.run_id}: the stream holds {copies}"
    await wait_until(lambda: _tape_has(bus, run.run_id, last), timeout=30, what=f"the tape to hold run {run.run_id}")


async def _tape_has(bus: NatsBus, run_id: str, last: int) -> bool:
    """The tape holds the run whole: its terminal at `last`, each seq once, the answer's text exactly.

    Not yet when the tape does not answer: after the broker's restart its client may still be
    reconnecting (its subscription comes back with it).
    """
    try:
        steps = await bus.request(subjects.tape("steps"), GetStepsRequest(run_id=run_id), GetStepsResponse)
    except BusError:
        return False
    seqs = [s.seq for s in steps.steps]
    text = "".join(json.loads(s.payload_json)["text"] for s in steps.steps if s.kind == "text")
    return steps.run.status == "COMPLETED" and seqs == sorted(set(seqs)) and seqs[-1] == last and text == EXPECTED_TEXT


@pytest.mark.timeout(120)
async def test_prompts_sent_while_the_broker_is_frozen_run_or_are_refused_clearly(
    fresh_nats: NatsServer, tmp_path: Path
) -> None:
    async with connect(fresh_nats.url, name="test", namespace="freeze") as bus:
        services = service_map(fresh_nats.url, "freeze", tmp_path / "data", app="tests.e2e.apps.ticker:app")
        async with run_stack(services, bus=bus) as stack:
            url = await stack.ingress_url()
            streaming = [asyncio.create_task(stream_one(url)) for _ in range(4)]
            await asyncio.sleep(0.5)
            os.kill(fresh_nats.pid, signal.SIGSTOP)
            try:
                submitted_frozen = [asyncio.create_task(stream_one(url)) for _ in range(4)]
                await asyncio.sleep(6.0)
            finally:
                os.kill(fresh_nats.pid, signal.SIGCONT)
            runs = await asyncio.wait_for(asyncio.gather(*streaming, *submitted_frozen), 90)
            notices = [n for r in runs for n in r.notices]
            print(f"frozen broker: runs={len(runs)} notices={[n['data'] for n in notices]}")  # for pytest -s
            # "Resume" is only ever said with the run id to resume; otherwise: send it again.
            assert all(n.get("runId") or "resume" not in n["data"] for n in notices), notices
            for run in runs:
                assert_seen_once(run)
                await assert_stored_once(bus, run)
