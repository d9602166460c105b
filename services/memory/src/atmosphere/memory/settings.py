"""Memory's settings: its database, the workspace root, composite file routes."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from atmosphere.config import WorkerSettings


class MemoryOptions(BaseModel):
    """`ATMOSPHERE_MEMORY__*`."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    db_path: Path | None = None
    """Conversation history and long-term facts (SQLite); default `<ATMOSPHERE_DATA_DIR>/memory.db`."""
    screen_timeout: float = Field(default=5.0, gt=0)
    """Seconds to wait for governance's fact screen; no answer stores nothing (fail-closed)."""


class FilesystemLlmSettings(BaseSettings):
    """The file-surface settings that keep Atmosphere's `LLM_*` names."""

    model_config = SettingsConfigDict(env_prefix="LLM_", frozen=True, extra="ignore", use_attribute_docstrings=True)

    filesystem_routes: str = ""
    """`prefix=dir,prefix=dir`: paths under a prefix go to a store shared by every conversation."""


class MemorySettings(WorkerSettings):
    """Everything memory reads from the environment."""

    memory: MemoryOptions = MemoryOptions()
    workspace_root: Path = Path(".atmosphere/workspace")
    """Where plans and files live (`{root}/{agents|coordinators|endpoints}/{owner}/...`)."""
    llm: FilesystemLlmSettings = Field(default_factory=FilesystemLlmSettings)

    @property
    def db_path(self) -> Path:
        """Where history and facts live."""
        return self.memory.db_path or self.data_dir / "memory.db"
