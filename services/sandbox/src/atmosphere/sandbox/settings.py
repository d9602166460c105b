"""Sandbox's settings: the app whose tools it hosts."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from atmosphere.config import WorkerSettings


class SandboxOptions(BaseModel):
    """`ATMOSPHERE_SANDBOX__*`."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    max_concurrent_calls: int = Field(default=64, ge=1, le=4096)
    """Tool calls this instance runs at once."""


class SandboxSettings(WorkerSettings):
    """Everything sandbox reads from the environment."""

    app: str = "examples.echo:app"
    """`module:attribute` of the `atmosphere.sdk.App` whose `@tool` functions are hosted."""
    app_dir: Path = Path()
    """Directory put first on `sys.path` before importing the app."""
    sandbox: SandboxOptions = SandboxOptions()
