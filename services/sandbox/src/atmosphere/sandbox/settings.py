"""Sandbox's settings."""

from __future__ import annotations

from atmosphere.config import WorkerSettings


class SandboxSettings(WorkerSettings):
    """Everything sandbox reads from the environment."""
