"""Governance's settings."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from atmosphere.config import WorkerSettings
from atmosphere.governance.store import DEFAULT_MAX_AGE_DAYS, DEFAULT_MAX_ROWS


class GovernanceOptions(BaseModel):
    """`ATMOSPHERE_GOVERNANCE__*`."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    db_path: Path | None = None
    """The decision log's SQLite file; default `<ATMOSPHERE_DATA_DIR>/governance.db`."""
    policy_files: list[Path] = []
    """Policy files (a JSON list of paths), native `policies:` or Microsoft `rules:` schema, after
    the app's own `atmosphere-policies.yaml`; one that does not parse stops governance at start."""
    pricing_file: Path | None = None
    """A JSON pricing table (`{"models": {name: {input, output, cached_input}}}`, USD per million
    tokens) whose models replace or extend the shipped table; cost ceilings are fed from it."""
    decision_log_max_rows: int = Field(default=DEFAULT_MAX_ROWS, ge=1)
    """The decision log keeps at most this many rows (the oldest go first)."""
    decision_log_max_age_days: float = Field(default=DEFAULT_MAX_AGE_DAYS, gt=0)
    """... and none older than this."""
    classifier_base_url: str = ""
    """The LLM_CLASSIFIER tier's OpenAI-compatible endpoint (e.g. `http://localhost:11434/v1`)."""
    classifier_model: str = ""
    """... the model it asks."""
    classifier_api_key: str = ""
    """... and its key (empty: none sent)."""
    slot_ttl: float = Field(default=3600.0, gt=0)
    """Seconds after which a run that never reported its end gives back its concurrency slot."""


class GovernanceSettings(WorkerSettings):
    """Everything governance reads from the environment."""

    governance: GovernanceOptions = GovernanceOptions()
    app_dir: Path = Path()
    """The app's directory: its `atmosphere-policies.yaml`, if any, is loaded first."""
    app: str = ""
    """The app (`module:attribute`) whose Python policies (`App(policies=[...])`) are installed after
    the files; empty: none are loaded."""
    ai_tool_injection_screen_mode: Literal["ANNOTATE", "SANITIZE", "OFF"] = "ANNOTATE"
    """The tool-output injection screen: wrap a flagged result in warning banners, withhold it, or off."""
    ai_rag_safety_on_breach: Literal["DROP", "FLAG", "SANITIZE"] = "DROP"
    """What happens to a retrieved document classified as an injection."""
    ai_rag_safety_fail_open: bool = False
    """Keep a retrieved document the classifier could not judge (off: it is dropped)."""
    ai_injection_screen_tier: Literal["RULE_BASED", "EMBEDDING_SIMILARITY", "LLM_CLASSIFIER"] = "RULE_BASED"
    """The classifier of the tool-output and document screens (higher tiers run on top of RULE_BASED):
    EMBEDDING_SIMILARITY needs `pip install 'atmosphere-ai-governance[embedding]'`, LLM_CLASSIFIER the
    `ATMOSPHERE_GOVERNANCE__CLASSIFIER_*` endpoint. A tier that cannot run stops governance at start."""
    ai_memory_safety_enabled: bool = True
    """Screen every long-term memory fact for prompt injection before it is stored."""
    ai_memory_safety_tier: str = "RULE_BASED"
    """The classifier: `RULE_BASED` (other tiers are not available here and fall back to it)."""
    ai_memory_safety_on_breach: Literal["DROP", "FLAG", "SANITIZE"] = "DROP"
    """What happens to an injected fact: dropped, stored flagged, or replaced by a placeholder."""
    ai_memory_safety_fail_open: bool = False
    """Store a fact the classifier could not judge (off: such a fact is dropped)."""

    @field_validator(
        "ai_memory_safety_on_breach",
        "ai_tool_injection_screen_mode",
        "ai_rag_safety_on_breach",
        "ai_injection_screen_tier",
        mode="before",
    )
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value

    @property
    def db_path(self) -> Path:
        """Where the decision log lives."""
        return self.governance.db_path or self.data_dir / "governance.db"
