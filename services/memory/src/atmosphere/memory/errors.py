"""Memory's wire codes: the requests its subjects refuse (classes of the catalogue).

They cross a boundary (ingress's admin API reads them back), so they are defined in
`atmosphere.bus.errors`; this module is where memory's own code takes them from. A history that
changed between two pages is the catalogue's `HistoryChangedError` (`memory.history_changed`).
"""

from __future__ import annotations

from atmosphere.bus.errors import MemoryBadRequestError, MemoryNotFoundError

__all__ = ["MemoryBadRequestError", "MemoryNotFoundError"]
