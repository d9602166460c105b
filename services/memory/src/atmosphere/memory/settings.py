"""Memory's settings."""

from __future__ import annotations

from pydantic import Field

from atmosphere.config import ServiceSettings


class MemorySettings(ServiceSettings):
    """Everything memory reads from the environment."""

    probe_port: int = Field(default=8184, ge=0, le=65535)
