"""Ingress's settings: where it listens and the bounds of each connection."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from atmosphere.config import ServiceSettings


class IngressOptions(BaseModel):
    """`ATMOSPHERE_INGRESS__*`."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    host: str = "127.0.0.1"
    """Interface to listen on; use 0.0.0.0 in a container."""
    port: int = Field(default=8080, ge=0, le=65535)
    """HTTP and WebSocket port (0 picks a free one; it is logged and shown in the info)."""
    max_message_bytes: int = Field(default=1 << 20, ge=1024)
    """Largest inbound WebSocket message; larger ones close the connection (1009)."""
    max_prompts_per_connection: int = Field(default=4, ge=1, le=256)
    """Prompts one connection may have running at once."""
    send_queue_frames: int = Field(default=1024, ge=16)
    """Frames buffered per connection for a slow client."""


class IngressSettings(ServiceSettings):
    """Everything ingress reads from the environment."""

    ingress: IngressOptions = IngressOptions()
