"""What a tool worker prints: drained as it comes, forwarded to the log within a budget.

The app's tools may print anything, as much as they like. The worker's stdout and stderr are
read continuously (a full pipe would block the tool that writes to it), logged line by line up
to `budget_bytes` per `window` seconds, and past that counted, not kept: the log says how many
bytes it dropped. The last few KiB of stderr are kept to explain a worker that dies starting.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

log = logging.getLogger("atmosphere.sandbox.tools")

CHUNK_BYTES: Final = 64 * 1024
LINE_BYTES: Final = 1024
"""A longer line is logged cut to this many bytes."""
TAIL_BYTES: Final = 4 * 1024


class OutputLog:
    """The bounded log of one worker's output."""

    def __init__(self, label: str, *, budget_bytes: int = 16 * 1024, window: float = 10.0) -> None:
        """Log what worker `label` prints, at most `budget_bytes` every `window` seconds."""
        self._label = label
        self._budget = budget_bytes
        self._window = window
        self._window_start = 0.0
        self._logged = 0
        self._dropped = 0
        self._tail = b""

    def tail(self) -> str:
        """The end of what the worker wrote to stderr."""
        return self._tail.decode("utf-8", errors="replace").strip()

    async def drain(self, stream: asyncio.StreamReader, name: str) -> None:
        """Read `stream` (the worker's `name`: stdout or stderr) to its end."""
        level = logging.WARNING if name == "stderr" else logging.INFO
        partial = b""
        while chunk := await stream.read(CHUNK_BYTES):
            if name == "stderr":
                self._tail = (self._tail + chunk)[-TAIL_BYTES:]
            lines = (partial + chunk).split(b"\n")
            partial = lines.pop()[:LINE_BYTES]  # an endless line is kept cut, never grown
            for line in lines:
                self._emit(level, name, line)
        if partial:
            self._emit(level, name, partial)
        self._report_dropped()

    def _emit(self, level: int, name: str, line: bytes) -> None:
        now = asyncio.get_running_loop().time()
        if now - self._window_start >= self._window:
            self._report_dropped()
            self._window_start, self._logged = now, 0
        if self._logged + len(line) > self._budget:
            self._dropped += len(line) + 1
            return
        self._logged += len(line) + 1
        text = line[:LINE_BYTES].decode("utf-8", errors="replace").rstrip()
        if len(line) > LINE_BYTES:
            text += " …[cut]"
        log.log(level, "%s %s: %s", self._label, name, text)

    def _report_dropped(self) -> None:
        if self._dropped:
            log.warning("%s: %d bytes of its output were not logged (over the log budget)", self._label, self._dropped)
            self._dropped = 0
