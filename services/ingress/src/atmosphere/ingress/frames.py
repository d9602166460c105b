"""The frame of an error ingress detects itself; every run event's frame is `atmosphere.bus.frames`'s."""

from __future__ import annotations

from atmosphere.bus.frames import Frame
from atmosphere.ingress.errors import IngressError


def error_frame(error: IngressError, *, session_id: str = "") -> Frame:
    """A frame for an error ingress itself detects (e.g. a malformed inbound frame): its code is the class's."""
    return {
        "type": "error",
        "data": error.message,
        "code": error.code,
        "recoverable": True,
        "sessionId": session_id,
        "seq": 0,
    }
