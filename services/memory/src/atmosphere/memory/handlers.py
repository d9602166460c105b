"""Memory's logic: conversation memory, plans and files (arrive with the harness issue)."""

from __future__ import annotations

from typing import Any


def runtime_info() -> dict[str, Any]:
    """Memory's runtime-truth fragment: only what is attached and running now."""
    return {}
