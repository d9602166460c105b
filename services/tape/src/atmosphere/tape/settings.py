"""Tape's settings."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from atmosphere.config import WorkerSettings


class TapeOptions(BaseModel):
    """`ATMOSPHERE_TAPE__*`."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    db_path: Path | None = None
    """The SQLite file; default `<ATMOSPHERE_DATA_DIR>/tape.db`."""
    max_batch: int = Field(default=512, ge=1)
    """The most events recorded in one transaction (one fetch from `ATMO_EVENTS`, one commit)."""
    batch_linger: float = Field(default=0.02, ge=0, le=1)
    """Seconds events may gather before the next fetch: fewer, larger commits under load (the
    tape's CPU per event halves at 0.02 s), at the price of recording up to this much later."""
    max_runs: int = Field(default=10_000, ge=1)
    """The most runs kept; past it the oldest ended runs are evicted with their steps."""
    max_age: float = Field(default=0, ge=0)
    """Seconds an ended run is kept after it started (0: no age limit)."""
    max_bytes: int = Field(default=0, ge=0)
    """The most payload bytes kept over all steps; past it the oldest ended runs are evicted (0: no limit)."""
    max_steps_per_run: int = Field(default=5000, ge=1)
    """Steps recorded per run; past it the run is marked truncated and later steps are dropped."""
    max_text_chars: int = Field(default=262_144, ge=1)
    """Characters of coalesced text in one `text` step; a longer answer continues in the next one."""
    idle_timeout: float = Field(default=1800, gt=0)
    """Seconds an open run may go without an event before the sweep marks it ABANDONED."""
    sweep_interval: float = Field(default=60, gt=0)
    """Seconds between sweeps (abandoned runs, the age limit)."""
    redact: bool = False
    """Mask email addresses, phone, SSN and card numbers (`[REDACTED]`) in every stored payload."""


class TapeSettings(WorkerSettings):
    """Everything tape reads from the environment."""

    tape: TapeOptions = TapeOptions()

    @property
    def db_path(self) -> Path:
        """Where the tape's SQLite database lives."""
        return self.tape.db_path or self.data_dir / "tape.db"
