"""Dispatch's settings: the app to serve and how many runs at once."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from atmosphere.config import WorkerSettings


class DispatchOptions(BaseModel):
    """`ATMOSPHERE_DISPATCH__*`."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    max_concurrent_runs: int = Field(default=16, ge=1, le=4096)
    """Runs this instance executes at once; more wait in `ATMO_RUNS` for any free worker."""
    run_ack_wait: float = Field(default=30.0, ge=1)
    """Seconds without a heartbeat after which JetStream hands a run to another worker."""


class DispatchSettings(WorkerSettings):
    """Everything dispatch reads from the environment."""

    app: str = "examples.echo:app"
    """`ATMOSPHERE_APP`: the `module:attribute` of the `atmosphere.sdk.App` to serve."""
    app_dir: Path = Path()
    """`ATMOSPHERE_APP_DIR`: put first on `sys.path` before importing the app."""
    dispatch: DispatchOptions = DispatchOptions()
