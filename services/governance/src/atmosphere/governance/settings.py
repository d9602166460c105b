"""Governance's settings."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator

from atmosphere.config import WorkerSettings


class GovernanceOptions(BaseModel):
    """`ATMOSPHERE_GOVERNANCE__*`."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    db_path: Path | None = None
    """The decision log's SQLite file; default `<ATMOSPHERE_DATA_DIR>/governance.db`."""
    policy_files: list[Path] = []
    """Policy files (a JSON list of paths), native `policies:` or Microsoft `rules:` schema, after
    the app's own `atmosphere-policies.yaml`; one that does not parse stops governance at start."""


class GovernanceSettings(WorkerSettings):
    """Everything governance reads from the environment."""

    governance: GovernanceOptions = GovernanceOptions()
    app_dir: Path = Path()
    """The app's directory: its `atmosphere-policies.yaml`, if any, is loaded first."""
    ai_memory_safety_enabled: bool = True
    """Screen every long-term memory fact for prompt injection before it is stored."""
    ai_memory_safety_tier: str = "RULE_BASED"
    """The classifier: `RULE_BASED` (other tiers are not available here and fall back to it)."""
    ai_memory_safety_on_breach: Literal["DROP", "FLAG", "SANITIZE"] = "DROP"
    """What happens to an injected fact: dropped, stored flagged, or replaced by a placeholder."""
    ai_memory_safety_fail_open: bool = False
    """Store a fact the classifier could not judge (off: such a fact is dropped)."""

    @field_validator("ai_memory_safety_on_breach", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value

    @property
    def db_path(self) -> Path:
        """Where the decision log lives."""
        return self.governance.db_path or self.data_dir / "governance.db"
