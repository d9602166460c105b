"""Memory's settings."""

from __future__ import annotations

from atmosphere.config import WorkerSettings


class MemorySettings(WorkerSettings):
    """Everything memory reads from the environment."""
