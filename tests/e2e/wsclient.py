"""A small WebSocket client for the agent endpoint."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import websockets


def ws_url(http_url: str, agent: str) -> str:
    return http_url.replace("http://", "ws://") + f"/atmosphere/agent/{agent}"


async def read_run(ws: websockets.ClientConnection, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Frames of one run, through its terminal frame."""
    frames: list[dict[str, Any]] = []
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        frames.append(frame)
        if frame.get("type") in {"complete", "error"} and frame.get("seq", 0) > 0:
            return frames


async def ask(http_url: str, agent: str, prompt: str) -> list[dict[str, Any]]:
    async with websockets.connect(ws_url(http_url, agent)) as ws:
        await ws.send(prompt)
        return await read_run(ws)


def assert_each_seq_once(frames: list[dict[str, Any]]) -> None:
    """The frames of one run: in seq order from 1, none twice.

    Seqs may skip: the server-side `input` events (the model's input) are never sent to clients.
    """
    seqs = [f["seq"] for f in frames]
    assert seqs == sorted(set(seqs)), seqs
    assert seqs[0] == 1, seqs
