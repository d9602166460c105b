"""One answer of the scripted model before a transport sends it, and the pacing of its stream.

A wire's encoder (`atmosphere.testing.openai_wire`) turns a `Turn` into an `Answer`: a JSON
body, or a stream of payloads. The pacing here is the wire's and the transport's common part:
the same delays (`chunk_delay`, `stall`, keep-alive comments) whether the stream goes out over
loopback HTTP (`atmosphere.testing.model_server`) or through the in-memory transport
(`ScriptedModel.handle`), so a test of a timeout sees the same stream both ways.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from atmosphere.testing.model_turns import Turn

STALL = "\x00stall"
"""In a wire's payloads: pause for the turn's `stall` here (never sent)."""
KEEP_ALIVE = b": keep-alive\n\n"
"""An SSE comment: what a provider sends to keep a connection open while it thinks."""


class Paced:
    """A turn's stream, each frame sent when the turn says; `delivered` once the last has gone out.

    `encode` makes a payload's bytes at send time (so a timestamp in it is the send time).
    `delivered` tells a client that stopped reading after the end (it read everything) from
    one that hung up mid-stream (a disconnect).
    """

    def __init__(self, turn: Turn, payloads: Sequence[str], encode: Callable[[str], bytes]) -> None:
        """Stream `payloads` of `turn`, each as `encode` makes it."""
        self.turn = turn
        self.payloads = payloads
        self.encode = encode
        self.delivered = False

    async def frames(self) -> AsyncGenerator[bytes, None]:
        """The frames, paced."""
        turn = self.turn
        if turn.shape == "comments":  # never an answer: only a disconnect ends it
            while True:
                yield KEEP_ALIVE
                await asyncio.sleep(turn.comment_every)
        last = len(self.payloads) - 1
        for index, payload in enumerate(self.payloads):
            if payload == STALL:
                await asyncio.sleep(turn.stall)
                continue
            if turn.chunk_delay:
                await asyncio.sleep(turn.chunk_delay)
            self.delivered = index == last
            yield self.encode(payload)
        self.delivered = True


@dataclass(frozen=True)
class Answer:
    """What the fake answers one HTTP request with: a JSON body, or a paced stream."""

    status: int
    json: Mapping[str, Any] | None = None
    stream: Paced | None = None
    headers: tuple[tuple[str, str], ...] = ()
    silence: float = 0.0
    """Seconds of saying nothing at all (not even headers) first."""
