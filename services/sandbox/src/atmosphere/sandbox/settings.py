"""Sandbox's settings."""

from __future__ import annotations

from pydantic import Field

from atmosphere.config import ServiceSettings


class SandboxSettings(ServiceSettings):
    """Everything sandbox reads from the environment."""

    probe_port: int = Field(default=8182, ge=0, le=65535)
