"""The tape's wire code: the queries it refuses (a class of the catalogue).

It crosses a boundary (ingress's admin API reads it back), so it is defined in
`atmosphere.bus.errors`; this module is where the tape's own code takes it from.
"""

from __future__ import annotations

from atmosphere.bus.errors import TapeBadRequestError

__all__ = ["TapeBadRequestError"]
