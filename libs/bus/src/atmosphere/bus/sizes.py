"""How much data one bus message may carry, and how text is measured and cut to fit.

nats-server closes a connection that sends a message over its `max_payload` (payload plus
headers), and the bus refuses such a send before it leaves (`PayloadTooLargeError`). Every edge
that admits data sizes it below that limit with room for what travels around the data, so an
oversized input becomes a clear answer instead of a refused send. The rooms and budgets are
defined here once, for every service:

* `data_budget`: data that is passed on inside another message (a tool call's arguments, a
  tool result, a turn, a file's page) keeps `ENVELOPE_ROOM` free, for the run event or the
  request that will wrap it (ids, the principal, timestamps, headers);
* `reply_budget`: a reply that carries data straight back keeps `REPLY_ROOM` free, for its own
  fields besides the data (ids, tokens, counters).

Data larger than one message travels in pages or through the JetStream Object Store, never
cut silently; what is cut ends with a marker (`clip`) saying so and how large it was.
"""

from __future__ import annotations

from typing import Final

from atmosphere.bus._codec import DEFAULT_MAX_PAYLOAD

ENVELOPE_ROOM: Final = 16 * 1024
"""Bytes kept free around data that another message will carry on (see `data_budget`)."""

REPLY_ROOM: Final = 2 * 1024
"""Bytes of a reply kept free for its own fields besides the data (see `reply_budget`)."""

MIN_DATA_BYTES: Final = 4 * 1024
"""The smallest data budget, even under a tiny broker limit (sends then fail clearly)."""

MIN_REPLY_BYTES: Final = 4 * REPLY_ROOM
"""The smallest reply budget, even under a tiny broker limit."""

MAX_OBJECT_BYTES: Final = 64 * 1024 * 1024
"""The largest object the bus stores in or reads from an object bucket (`Bus.object_put`).

Objects carry what is too large for one message (a big tool result); this bounds what any
service holds in memory for one of them.
"""

_CUT_MARKER: Final = "\n…[truncated: {what} is {size} bytes; only the first {kept} bytes are shown]"


def data_budget(max_payload: int) -> int:
    """The most bytes of data one message may carry when another message will carry it on."""
    return max(MIN_DATA_BYTES, max_payload - ENVELOPE_ROOM)


def reply_budget(max_payload: int) -> int:
    """The most bytes of data a reply may carry besides its own fields."""
    return max(MIN_REPLY_BYTES, max_payload - REPLY_ROOM)


def utf8_len(text: str) -> int:
    """`text`'s size on the wire (a lone surrogate counted as the 3 bytes it would take)."""
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
    kept = head(text, max_bytes - utf8_len(_CUT_MARKER.format(what=what, size=size, kept=size)))
    return kept + _CUT_MARKER.format(what=what, size=size, kept=utf8_len(kept))


__all__ = [
    "DEFAULT_MAX_PAYLOAD",
    "ENVELOPE_ROOM",
    "MAX_OBJECT_BYTES",
    "MIN_DATA_BYTES",
    "MIN_REPLY_BYTES",
    "REPLY_ROOM",
    "clip",
    "data_budget",
    "head",
    "reply_budget",
    "utf8_len",
]
