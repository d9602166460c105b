"""What one run of an agent's test produced: its events, and the frames a WebSocket client receives."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel

from atmosphere.bus.frames import Frame, to_frame
from atmosphere.contracts.run.v1.run_pb2 import RunEvent

T = TypeVar("T", bound=BaseModel)


@dataclass(frozen=True)
class RunResult:
    """Everything one run produced, in order."""

    run_id: str
    events: tuple[RunEvent, ...]
    """The `RunEvent`s as dispatch published them (seq order)."""
    frames: tuple[Frame, ...]
    """The same events as the JSON frames a WebSocket client receives."""

    @property
    def kinds(self) -> list[str]:
        """Each frame's `type` or `event` name, e.g. `["tool-start", "tool-result", "streaming-text", ...]`."""
        return [str(f.get("type") or f.get("event")) for f in self.frames]

    @property
    def text(self) -> str:
        """The answer: every `streaming-text` frame joined."""
        return "".join(str(f["data"]) for f in self.frames if f.get("type") == "streaming-text")

    @property
    def completed(self) -> bool:
        """Whether the run ended with a `complete` frame."""
        return bool(self.frames) and self.frames[-1].get("type") == "complete"

    @property
    def error(self) -> Frame | None:
        """The terminal `error` frame (`data` is the message, `code` the error code), or None."""
        last = self.frames[-1] if self.frames else None
        return last if last is not None and last.get("type") == "error" else None

    def of(self, kind: str) -> list[Frame]:
        """The frames of one `type` or `event` name (`"tool-result"`, `"plan-update"`, ...)."""
        return [f for f in self.frames if kind in (f.get("type"), f.get("event"))]

    def tool_results(self) -> dict[str, str]:
        """Each tool's last successful result (`tool-result`), by tool name; errors are not in it.

        A call that failed (the tool raised, was refused, timed out, or its approval was denied)
        is in `tool_errors()` instead, so a test cannot mistake an error text for a result.
        """
        return self._last_by_tool("tool-result", "result")

    def tool_errors(self) -> dict[str, str]:
        """Each tool's last error (`tool-error`) text, by tool name (what the model was told)."""
        return self._last_by_tool("tool-error", "error")

    def _last_by_tool(self, event: str, field: str) -> dict[str, str]:
        found: dict[str, str] = {}
        for frame in self.frames:
            if frame.get("event") == event:
                data = frame["data"]
                found[str(data.get("toolName"))] = str(data.get(field, ""))
        return found

    def output(self, model: type[T]) -> T:
        """The structured output (`entity-complete`) of an agent with `response_format`, validated."""
        entities = self.of("entity-complete")
        if not entities:
            msg = f"run {self.run_id} produced no structured output (frames: {self.kinds})"
            raise AssertionError(msg)
        data = entities[-1]["data"]
        value = data.get("entity", data) if isinstance(data, dict) else data
        return model.model_validate(value if not isinstance(value, str) else json.loads(value))


def result_of(run_id: str, events: list[RunEvent]) -> RunResult:
    """The result of the run `run_id` that sent `events` (in seq order, through its terminal one)."""
    frames = tuple(frame for frame in (to_frame(e) for e in events) if frame is not None)
    return RunResult(run_id=run_id, events=tuple(events), frames=frames)
