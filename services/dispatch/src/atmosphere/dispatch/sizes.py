"""How much data one bus message may carry: the broker's limit less room for the envelope.

nats-server closes a connection that sends a message over its `max_payload` (payload plus
headers). The bus refuses such a send before it leaves (`PayloadTooLargeError`); dispatch
sizes what it admits below that, so a model's huge tool call, a huge tool result or a huge
turn becomes a clear text for the model and the client instead of a failed send.
"""

from __future__ import annotations

from typing import Final

from atmosphere.bus import Bus

ENVELOPE_ROOM: Final = 16 * 1024
"""Bytes kept free around a message's data: ids, the principal, headers, the run event that
carries a tool call or result on to the client."""

MIN_DATA_BYTES: Final = 4 * 1024
"""The smallest data budget used, even with a tiny broker limit (then sends fail clearly)."""


def data_budget(bus: Bus) -> int:
    """The most bytes of data (tool arguments, a tool result, a turn) one message may carry."""
    return max(MIN_DATA_BYTES, bus.max_payload - ENVELOPE_ROOM)


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


def clip(text: str, max_bytes: int, what: str) -> str:
    """`text` within `max_bytes`; when cut, it ends with a marker naming `what` and its whole size."""
    size = utf8_len(text)
    if size <= max_bytes:
        return text
    template = "\n…[truncated: {what} is {size} bytes; only the first {kept} bytes are shown]"
    kept = head(text, max_bytes - utf8_len(template.format(what=what, size=size, kept=size)))
    return kept + template.format(what=what, size=size, kept=utf8_len(kept))


__all__ = ["ENVELOPE_ROOM", "MIN_DATA_BYTES", "clip", "data_budget", "head", "utf8_len"]
