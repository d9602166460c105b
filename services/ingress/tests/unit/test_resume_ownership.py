"""A WebSocket resume reaches only the caller's own runs; anyone else's reads as an unknown run."""

from __future__ import annotations

import asyncio

from atmosphere.bus import BusError, JetStreamLayout
from atmosphere.bus.frames import Frame
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.ingress.connection import Closed, Connection


async def resume_frames(bus: FakeBus, run_id: str, *, allowed: bool | BusError | None) -> tuple[list[Frame], list[str]]:
    """The frames a connection sends for a resume request, and which run ids it checked.

    `allowed` is the owner check's answer: None for no check (no-auth mode), an error it raises.
    """
    checked: list[str] = []

    async def may_resume(candidate: str) -> bool:
        checked.append(candidate)
        if isinstance(allowed, BusError):
            raise allowed
        return bool(allowed)

    connection = Connection(
        bus=bus,
        agent=AgentDescriptor(name="echo", path="/atmosphere/agent/echo"),
        conversation_id="c1",
        principal=Principal(user_id="bob"),
        transport="websocket",
        max_prompts=4,
        send_queue_frames=16,
        may_resume=None if allowed is None else may_resume,
    )
    sent: list[Frame] = []
    got_frame = asyncio.Event()

    async def send(frame: Frame) -> None:
        sent.append(frame)
        got_frame.set()

    async def receive() -> str | Closed:
        await asyncio.wait_for(got_frame.wait(), 5)
        return Closed(1006)

    async def close(_code: int, _reason: str) -> None:
        return None

    await connection.serve(receive, send, close, resume=(run_id, 0))
    return sent, checked


async def test_someone_elses_run_is_refused_exactly_like_an_unknown_one() -> None:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    refused, checked = await resume_frames(bus, "adas-run", allowed=False)
    unknown, _ = await resume_frames(bus, "adas-run", allowed=None)  # no-auth mode: nothing stored
    assert checked == ["adas-run"]
    assert refused == unknown
    assert [(f["type"], f["code"], f["data"]) for f in refused] == [
        ("error", "ingress.unknown_run", "Unknown run adas-run")
    ]


async def test_an_owner_check_the_broker_cannot_answer_names_the_run_to_resume() -> None:
    # The broker is down (frozen, restarting): the client is told to come back for *its* run,
    # never a bare "reconnect" it could take for a prompt that was not started.
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    frames, checked = await resume_frames(bus, "my-run", allowed=BusError("request timed out"))
    assert checked == ["my-run"]
    assert [(f["type"], f["code"], f["runId"], f["seq"]) for f in frames] == [
        ("error", "ingress.unavailable", "my-run", 0)
    ]
    assert "X-Atmosphere-Run-Id my-run" in frames[0]["data"]
