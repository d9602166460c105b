r"""The frames between the sandbox and a JavaScript worker: one JSON object per line.

`json.dumps` escapes every control character and non-ASCII character, so a frame never holds a
raw newline and its size in bytes is bounded by its text: at most 6 bytes per UTF-16 unit
(`\uXXXX`). Both sides read with a bound, so neither can be made to buffer without limit.

- worker → sandbox, once at start: `{"ready": true, "version": ..., "v8": ..., "data_limit": ...}`,
  or `{"ready": false, "reason": ...}` (then it exits);
- sandbox → worker: `{"id": n, "code": ...}`;
- worker → sandbox: `{"id": n, "kind": "result"|"error"|"timeout"|"oom", "text": ..., "truncated": bool}`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

MAX_CODE_CHARS: Final = 256 * 1024
"""The longest code one call may send (characters)."""
MAX_REQUEST_BYTES: Final = 6 * 2 * MAX_CODE_CHARS + 1024
"""The largest request frame a worker reads: the longest code, each character escaped (astral
ones as two `\\uXXXX` escapes), plus the envelope."""
_REPLY_ENVELOPE_BYTES: Final = 1024

ReplyKind = Literal["result", "error", "timeout", "oom"]
REPLY_KINDS: Final = frozenset({"result", "error", "timeout", "oom"})


class FrameError(ValueError):
    """A frame that is not what the protocol says (the other side is broken)."""


def reply_limit(max_output_chars: int) -> int:
    """The largest reply frame a worker cut to `max_output_chars` can send (the sandbox reads no more)."""
    return 6 * max_output_chars + _REPLY_ENVELOPE_BYTES


def encode(frame: dict[str, Any]) -> bytes:
    """`frame` as one line."""
    return json.dumps(frame, ensure_ascii=True, separators=(",", ":")).encode("ascii") + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    """One line as a frame (a JSON object); anything else is a `FrameError`."""
    try:
        frame = json.loads(line)
    except (ValueError, RecursionError) as exc:
        msg = f"not a JSON frame: {line[:80]!r}"
        raise FrameError(msg) from exc
    if not isinstance(frame, dict):
        msg = f"not a JSON object: {line[:80]!r}"
        raise FrameError(msg)
    return cast("dict[str, Any]", frame)


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds of every evaluation of one worker (given on its command line)."""

    timeout_seconds: float
    max_memory_bytes: int
    max_output_chars: int
    """UTF-16 units of a result or error text kept; the rest is cut."""


@dataclass(frozen=True, slots=True)
class Reply:
    """What a worker answered to one request."""

    request_id: int
    kind: ReplyKind
    text: str
    """The result, or the JavaScript error's `Name: message` (cut like a result)."""
    truncated: bool = False

    def frame(self) -> dict[str, Any]:
        """This reply as the frame the worker sends."""
        return {"id": self.request_id, "kind": self.kind, "text": self.text, "truncated": self.truncated}

    @classmethod
    def parse(cls, frame: dict[str, Any]) -> Reply:
        """The reply in `frame`; a frame of any other shape is a `FrameError`."""
        request_id, kind, text = frame.get("id"), frame.get("kind"), frame.get("text")
        truncated = frame.get("truncated", False)
        if (
            not isinstance(request_id, int)
            or kind not in REPLY_KINDS
            or not isinstance(text, str)
            or not isinstance(truncated, bool)
        ):
            msg = f"not a reply frame: {sorted(frame)}"
            raise FrameError(msg)
        return cls(request_id, cast("ReplyKind", kind), text, truncated)
