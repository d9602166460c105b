"""`code_exec`'s settings, named after the original's keys `org.atmosphere.ai.code.<key>`.

Each key reads as `ATMOSPHERE_AI_CODE_<KEY>` (dots to underscores, upper-cased), so the original's
camelCase keys keep their spelling: `ATMOSPHERE_AI_CODE_PIDSLIMIT`, `..._EXECTIMEOUTSECONDS`; the
snake-case form (`ATMOSPHERE_AI_CODE_PIDS_LIMIT`) is read too. As in the original, a non-positive
number means "the default"; a value that is not a number at all (or a size without a known suffix)
stops the service at start, naming the variable.
"""

from __future__ import annotations

import math
import re
from typing import Any, Final, Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

KIB: Final = 1024
MIB: Final = 1024 * KIB
GIB: Final = 1024 * MIB

DEFAULT_IMAGE: Final = "mcr.microsoft.com/playwright:v1.60.0-noble"
DEFAULT_MEMORY: Final = "512m"

_SIZE = re.compile(r"(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[kmg]?)b?", re.IGNORECASE)
_UNITS: Final = {"": 1, "k": KIB, "m": MIB, "g": GIB}

_DEFAULTS: Final[dict[str, float]] = {
    "cpus": 1.0,
    "pids_limit": 256,
    "exec_timeout_seconds": 60.0,
    "sandbox_ttl_seconds": 300.0,
    "max_output_bytes": MIB,
    "file_size_bytes": 64 * MIB,
    "open_files": 256,
    "workspace_bytes": 512 * MIB,
    "max_artifacts": 8,
    "max_artifact_bytes": 8 * MIB,
    "max_sessions": 32,
}


def parse_size(text: str) -> int:
    """Bytes of a size such as `512m`, `64k`, `1g` or `1048576` (k/m/g are powers of 1024).

    Raises:
        ValueError: `text` is no size.
    """
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        msg = f"not a size (a number with an optional k, m or g suffix): {text!r}"
        raise ValueError(msg)
    return int(float(match["number"]) * _UNITS[match["unit"].lower()])


class CodeSettings(BaseSettings):
    """`ATMOSPHERE_AI_CODE_*`: whether `code_exec` is offered, where it runs and its bounds."""

    model_config = SettingsConfigDict(
        env_prefix="ATMOSPHERE_AI_CODE_",
        # The prefix applies to the camelCase aliases as well, and the field names stay readable too.
        env_prefix_target="all",
        populate_by_name=True,
        frozen=True,
        extra="ignore",
        use_attribute_docstrings=True,
    )

    enabled: bool = False
    """Offer the `code_exec` tool (bash, python and javascript in an isolated sandbox; default off)."""
    engine: Literal["auto", "bwrap", "docker", "podman"] = "auto"
    """Where code runs: `bwrap` (bubblewrap namespaces plus cgroups on this host), `docker` or
    `podman` (a container per session, the original's engines); `auto` tries them in that order
    and takes the first that really starts a sandbox."""
    image: str = DEFAULT_IMAGE
    """The container image (docker and podman only)."""
    network: Literal["none"] = "none"
    """The sandbox's network: `none` is the only choice (a private network namespace with only `lo`)."""
    memory: str = DEFAULT_MEMORY
    """Memory of one sandbox: bytes, or a number with a k, m or g suffix (`512m`)."""
    cpus: float = 1.0
    """CPUs one sandbox may use at once (a CPU quota, e.g. 0.5 or 2)."""
    pids_limit: int = Field(default=256, validation_alias="pidsLimit")
    """Processes and threads one sandbox may hold at once (a fork bomb stops here)."""
    exec_timeout_seconds: float = Field(default=60.0, validation_alias="execTimeoutSeconds")
    """Wall-clock seconds one `code_exec` call may run; then every process of it is killed."""
    sandbox_ttl_seconds: float = Field(default=300.0, validation_alias="sandboxTtlSeconds")
    """Seconds a run's sandbox may sit idle before it is torn down (its files go with it)."""
    max_output_bytes: int = Field(default=MIB, validation_alias="maxOutputBytes")
    """Bytes kept of stdout and of stderr, each. Past it the code is killed (not just cut: a flood
    stops at once) and the stream ends with a marker saying so."""
    setup: str = ""
    """A bootstrap command run once per sandbox, with `bash -lc`, inside it, before the first code."""
    cpu_seconds: float | None = Field(default=None, validation_alias="cpuSeconds")
    """Our addition: CPU seconds one process may use (`RLIMIT_CPU`), a backstop to the wall-clock
    timeout. Unset: the exec timeout times the CPUs, plus one."""
    file_size_bytes: int = Field(default=64 * MIB, validation_alias="fileSizeBytes")
    """Our addition: the largest file one process may write (`RLIMIT_FSIZE`)."""
    open_files: int = Field(default=256, validation_alias="openFiles")
    """Our addition: open files per process (`RLIMIT_NOFILE`)."""
    workspace_bytes: int = Field(default=512 * MIB, validation_alias="workspaceBytes")
    """Our addition: disk space of one sandbox's `/workspace` (bwrap), checked while code runs and
    after; past it the code is killed and the workspace emptied. The size of a container's tmpfs."""
    max_artifacts: int = Field(default=8, validation_alias="maxArtifacts")
    """Files collected from `/workspace/artifacts` after each call (the original's 8); more are dropped."""
    max_artifact_bytes: int = Field(default=8 * MIB, validation_alias="maxArtifactBytes")
    """Bytes collected from `/workspace/artifacts` after each call, all files together (the
    original's 8 MiB); a file that does not fit is dropped, not cut."""
    max_sessions: int = Field(default=32, validation_alias="maxSessions")
    """Our addition: sandboxes (runs using `code_exec`) alive at once; one more is refused."""

    @field_validator("memory", mode="before")
    @classmethod
    def _memory_size(cls, value: object) -> object:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(int(value)) if value > 0 else DEFAULT_MEMORY
        if isinstance(value, str):
            if not value.strip() or parse_size(value) <= 0:
                return DEFAULT_MEMORY
            return value.strip()
        return value

    @field_validator("image", mode="before")
    @classmethod
    def _image_or_default(cls, value: object) -> object:
        return DEFAULT_IMAGE if isinstance(value, str) and not value.strip() else value

    @field_validator(*_DEFAULTS)
    @classmethod
    def _positive_or_default(cls, value: Any, info: ValidationInfo) -> Any:
        # The original's rule: zero or a negative number means "use the default".
        if math.isnan(value) or value <= 0:
            return type(value)(_DEFAULTS[str(info.field_name)])
        return value

    @field_validator("cpu_seconds")
    @classmethod
    def _positive_or_unset(cls, value: float | None) -> float | None:
        return value if value is not None and value > 0 else None

    @property
    def memory_bytes(self) -> int:
        """`memory` in bytes."""
        return parse_size(self.memory)

    @property
    def cpu_limit_seconds(self) -> int:
        """`RLIMIT_CPU` of one process: `cpu_seconds`, or the exec timeout times the CPUs, plus one."""
        if self.cpu_seconds is not None:
            return math.ceil(self.cpu_seconds)
        return math.ceil(self.exec_timeout_seconds * max(self.cpus, 1.0)) + 1
