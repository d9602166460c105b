"""Sandbox's logic: hosting the app's tools (arrives with the dispatch issue)."""

from __future__ import annotations

from typing import Any


def runtime_info() -> dict[str, Any]:
    """Sandbox's runtime-truth fragment: only what is attached and running now."""
    return {}
