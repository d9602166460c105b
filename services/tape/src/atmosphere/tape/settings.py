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


class TapeSettings(WorkerSettings):
    """Everything tape reads from the environment."""

    tape: TapeOptions = TapeOptions()

    @property
    def db_path(self) -> Path:
        """Where the tape's SQLite database lives."""
        return self.tape.db_path or self.data_dir / "tape.db"
