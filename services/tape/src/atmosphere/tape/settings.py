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
    max_concurrent_writes: int = Field(default=512, ge=1)
    """Events being recorded at once; they are committed together in batches."""


class TapeSettings(WorkerSettings):
    """Everything tape reads from the environment."""

    tape: TapeOptions = TapeOptions()

    @property
    def db_path(self) -> Path:
        """Where the tape's SQLite database lives."""
        return self.tape.db_path or self.data_dir / "tape.db"
