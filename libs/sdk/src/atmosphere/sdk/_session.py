"""`StreamingSession`: how an agent talks back to its client during one run."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from atmosphere.contracts.common.v1.common_pb2 import Error, Usage
from atmosphere.contracts.run.v1.run_pb2 import Complete, Metadata, Progress, RunEvent, TextDelta
from atmosphere.sdk.errors import AGENT_ERROR

log = logging.getLogger("atmosphere.sdk")

EventSink = Callable[[RunEvent], Awaitable[None]]
"""Receives each event in order; the host stamps ids, seq and time and publishes it."""


class SessionHost(Protocol):
    """What a `StreamingSession` fronts: the host's run (dispatch's `Run`).

    The host writes every event, keeps the first terminal event the last one (later ones are
    dropped and counted), and answers `stream(message)` with the agent's model.
    """

    @property
    def closed(self) -> bool:
        """Whether the terminal event was written."""
        ...

    @property
    def dropped(self) -> int:
        """How many events arrived after the terminal one and were dropped."""
        ...

    async def emit(self, event: RunEvent) -> None:
        """Write `event` (a terminal kind closes the run)."""
        ...

    async def stream(self, message: str) -> None:
        """Answer `message` with the agent's model, to a terminal event."""
        ...


@dataclass(frozen=True, slots=True)
class TokenUsage:
    """Tokens of one model round."""

    input: int = 0
    output: int = 0
    cached_input: int = 0
    total: int = 0
    model: str = ""

    def to_proto(self) -> Usage:
        """As a `common.v1.Usage` (total defaults to input + output)."""
        return Usage(
            input_tokens=self.input,
            output_tokens=self.output,
            cached_input_tokens=self.cached_input,
            total_tokens=self.total or self.input + self.output,
            model=self.model,
        )


class StreamingSession:
    """The stream of one run, as the agent (and the runtime) sees it: a thin front over its host.

    Every method builds one event and hands it to the host, which writes it. The first
    terminal call (`complete` or `error`) wins; anything sent after it is dropped and logged
    once.
    """

    def __init__(
        self,
        host: SessionHost,
        *,
        run_id: str,
        session_id: str,
        conversation_id: str,
    ) -> None:
        """Front `host` (dispatch's run; outside dispatch, `atmosphere.bus.runs.SinkHost`) for run `run_id`."""
        self._host = host
        self.run_id = run_id
        """The id of the run this session streams."""
        self.session_id = session_id
        """The per-prompt stream id (`sessionId` on every client frame)."""
        self.conversation_id = conversation_id
        """The conversation this turn belongs to."""

    @property
    def closed(self) -> bool:
        """Whether a terminal event was sent."""
        return self._host.closed

    @property
    def dropped(self) -> int:
        """How many sends arrived after the terminal event and were dropped."""
        return self._host.dropped

    async def emit(self, event: RunEvent) -> None:
        """Send a typed event (any `RunEvent` kind); terminal kinds close the session."""
        await self._host.emit(event)

    async def stream(self, message: str) -> None:
        """Answer `message` with the agent's model: its system prompt, tools and policies.

        Streams text, tool events and usage into this session and ends it.
        """
        await self._host.stream(message)

    async def send(self, text: str) -> None:
        """Stream a chunk of the answer (`streaming-text`)."""
        await self.emit(RunEvent(text_delta=TextDelta(text=text)))

    async def progress(self, message: str, percentage: float | None = None) -> None:
        """Show a status line (`progress`)."""
        await self.emit(RunEvent(progress=Progress(message=message, percentage=percentage)))

    async def metadata(self, key: str, value: Any) -> None:
        """Send a key and any JSON-serializable value (`metadata`)."""
        await self.emit(RunEvent(metadata=Metadata(key=key, value_json=json.dumps(value))))

    async def usage(self, usage: TokenUsage) -> None:
        """Report the tokens of one model round (`usage`)."""
        await self.emit(RunEvent(usage=usage.to_proto()))

    async def complete(self, summary: str | None = None) -> None:
        """End the run successfully (`complete`)."""
        await self.emit(RunEvent(complete=Complete(summary=summary or "")))

    async def error(self, message: str, *, code: str = AGENT_ERROR, retryable: bool = False) -> None:
        """End the run with an error (`error`); `retryable` is the client frame's `recoverable`."""
        await self.emit(RunEvent(error=Error(code=code, message=message, retryable=retryable)))
