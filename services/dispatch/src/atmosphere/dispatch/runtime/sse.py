"""Incremental Server-Sent Events decoding of a streamed HTTP body."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator

MAX_EVENT_BYTES = 1 << 20
"""A provider event larger than this is refused rather than buffered without end."""


class SseError(ValueError):
    """The stream broke the SSE framing or a bound."""


async def sse_data(lines: AsyncIterable[str]) -> AsyncIterator[str]:
    """Yield the `data` of each event as soon as its blank line arrives.

    Comment lines (`:`) and other fields (`event:`, `id:`, `retry:`) are skipped; several
    `data:` lines of one event are joined with newlines, as the SSE specification says.
    """
    parts: list[str] = []
    size = 0
    async for line in lines:
        if not line:
            if parts:
                yield "\n".join(parts)
                parts, size = [], 0
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name != "data":
            continue
        value = value.removeprefix(" ")
        size += len(value)
        if size > MAX_EVENT_BYTES:
            msg = f"a provider event exceeded {MAX_EVENT_BYTES} bytes"
            raise SseError(msg)
        parts.append(value)
    if parts:
        # A final event without its blank line still counts: some servers close right after it.
        yield "\n".join(parts)
