"""Governance's settings."""

from __future__ import annotations

from atmosphere.config import WorkerSettings


class GovernanceSettings(WorkerSettings):
    """Everything governance reads from the environment."""
