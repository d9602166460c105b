"""How much data fits in one answer of memory's: the broker's limit less room for the envelope.

nats-server closes a connection that sends a message over its `max_payload` (payload plus
headers), so memory never builds a reply it cannot send: histories, listings and file reads
come in pages, and a tool's text is cut with a marker that says so and how large it was.
"""

from __future__ import annotations

from typing import Final

DEFAULT_MAX_PAYLOAD: Final = 1 << 20
"""nats-server's default `max_payload` (1 MiB), for handlers built without a bus."""

ENVELOPE_ROOM: Final = 16 * 1024
"""Bytes kept free in a tool result for what dispatch wraps around it on the way to the client
(the run event's ids, principal and timestamps), so dispatch can pass it on unchanged."""

REPLY_ROOM: Final = 1024
"""Bytes kept free in a plain reply for its own fields besides the data (ids, tokens, counters)."""


def utf8_len(text: str) -> int:
    """`text`'s size on the wire."""
    return len(text.encode("utf-8", errors="surrogatepass"))


def head(text: str, max_bytes: int) -> str:
    """The longest prefix of `text` of at most `max_bytes` UTF-8 bytes, cut between characters."""
    if max_bytes <= 0:
        return ""
    data = text.encode("utf-8", errors="surrogatepass")
    if len(data) <= max_bytes:
        return text
    return data[:max_bytes].decode("utf-8", errors="ignore")


def clip(text: str, max_bytes: int, what: str = "the output") -> tuple[str, bool]:
    """`text` within `max_bytes`, ending with a marker that says it was cut and its whole size."""
    size = utf8_len(text)
    if size <= max_bytes:
        return text, False
    marker_template = "\n…[truncated: {what} is {size} bytes; only the first {kept} bytes are shown]"
    room = max_bytes - utf8_len(marker_template.format(what=what, size=size, kept=size))
    kept = head(text, room)
    return kept + marker_template.format(what=what, size=size, kept=utf8_len(kept)), True


__all__ = ["DEFAULT_MAX_PAYLOAD", "ENVELOPE_ROOM", "REPLY_ROOM", "clip", "head", "utf8_len"]
