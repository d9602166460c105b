"""Governance's settings."""

from __future__ import annotations

from pydantic import Field

from atmosphere.config import ServiceSettings


class GovernanceSettings(ServiceSettings):
    """Everything governance reads from the environment."""

    probe_port: int = Field(default=8183, ge=0, le=65535)
