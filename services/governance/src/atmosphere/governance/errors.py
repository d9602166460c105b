"""Governance's wire code: the requests it refuses before deciding anything (a catalogue class).

It is defined in `atmosphere.bus.errors`, since callers read it back; this module is where
governance's own code takes it from. A denial is no error of governance's: it is a `Decision`,
which dispatch turns into the catalogue's `GovernanceDeniedError`.
"""

from __future__ import annotations

from atmosphere.bus.errors import GovernanceBadRequestError

__all__ = ["GovernanceBadRequestError"]
