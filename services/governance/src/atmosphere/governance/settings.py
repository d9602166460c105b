"""Governance's settings."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from atmosphere.config import WorkerSettings


class GovernanceOptions(BaseModel):
    """`ATMOSPHERE_GOVERNANCE__*`."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    db_path: Path | None = None
    """The decision log's SQLite file; default `<ATMOSPHERE_DATA_DIR>/governance.db`."""


class GovernanceSettings(WorkerSettings):
    """Everything governance reads from the environment."""

    governance: GovernanceOptions = GovernanceOptions()

    @property
    def db_path(self) -> Path:
        """Where the decision log lives."""
        return self.governance.db_path or self.data_dir / "governance.db"
