"""Governance's logic: the policy plane (admission and tool checks arrive with the dispatch issue)."""

from __future__ import annotations

from typing import Any


def runtime_info() -> dict[str, Any]:
    """Governance's runtime-truth fragment: only what is attached and running now."""
    return {}
