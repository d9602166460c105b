"""Sandbox's settings: the app whose tools it hosts, and how many calls and how large a result."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from atmosphere.bus.sizes import MAX_OBJECT_BYTES
from atmosphere.config import WorkerSettings
from atmosphere.sandbox.handlers import DEFAULT_MAX_RESULT_BYTES


class SandboxOptions(BaseModel):
    """`ATMOSPHERE_SANDBOX__*`."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    max_concurrent_calls: int = Field(default=64, ge=1, le=4096)
    """Tool calls this instance runs at once."""
    max_result_bytes: int = Field(default=DEFAULT_MAX_RESULT_BYTES, ge=1024, le=MAX_OBJECT_BYTES)
    """The largest tool result (UTF-8 bytes) passed on whole; a longer one is cut, with a marker.

    A result too large for one bus message travels through the object bucket `ATMO_TOOL_RESULTS`.
    """


class SandboxSettings(WorkerSettings):
    """Everything sandbox reads from the environment."""

    app: str = "examples.echo:app"
    """`module:attribute` of the `atmosphere.sdk.App` whose `@tool` functions are hosted."""
    app_dir: Path = Path()
    """Directory put first on `sys.path` before importing the app."""
    sandbox: SandboxOptions = SandboxOptions()
