"""Dispatch's settings: the app, concurrency, the model provider (`LLM_*`) and gRPC."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from atmosphere.config import AuthOptions, WorkerSettings


class DispatchOptions(BaseModel):
    """`ATMOSPHERE_DISPATCH__*`."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    max_concurrent_runs: int = Field(default=16, ge=1, le=4096)
    """Runs this instance executes at once, per nesting level (top-level runs, and sub-runs one,
    two and three levels down each have this many); more wait in `ATMO_RUNS` for a free worker."""
    run_ack_wait: float = Field(default=30.0, ge=1)
    """Seconds without a heartbeat after which JetStream hands a run to another worker."""
    grpc_host: str = "0.0.0.0"
    """Interface of the gRPC `DispatchService`."""
    grpc_port: int = Field(default=50051, ge=0, le=65535)
    """Port of the gRPC `DispatchService` (0 picks a free one; it is shown in the info)."""
    governance_timeout: float = Field(default=5.0, gt=0)
    """Seconds to wait for governance; no answer means the request is refused (fail-closed)."""
    approval_timeout: float = Field(default=300.0, gt=0)
    """Seconds a tool that needs approval waits for the decision."""
    max_run_deliveries: int = Field(default=5, ge=1, le=100)
    """Deliveries of one run (its worker died, or failed, each time) after which it is ended
    with an error instead of being tried again: a run that crashes its worker cannot do so forever."""


class LlmSettings(BaseSettings):
    """The model provider, with Atmosphere's `LLM_*` names.

    The generation knobs are read as text and sanitized by `generation_options`: a malformed
    value is logged and ignored instead of stopping the service.
    """

    model_config = SettingsConfigDict(env_prefix="LLM_", frozen=True, extra="ignore", use_attribute_docstrings=True)

    base_url: str = ""
    """OpenAI-compatible base URL, e.g. `https://api.openai.com/v1`; unset: no model runtime."""
    api_key: str = ""
    """Sent as `Authorization: Bearer <key>` when set."""
    model: str = ""
    """Model name sent with every request."""
    temperature: str = ""
    """Sampling temperature, clamped to [0.0, 2.0]."""
    max_tokens: str = ""
    """Most output tokens per model call; non-positive values are ignored."""
    top_p: str = ""
    """Nucleus sampling, clamped to [0.0, 1.0]."""
    stop: str = ""
    """Comma-separated stop sequences; blank entries are dropped."""
    connect_timeout: float = Field(default=5.0, gt=0)
    """Seconds to open a connection to the provider (each attempt)."""
    first_byte_timeout: float = Field(default=10.0, gt=0)
    """Seconds an attempt waits for the first byte of the provider's answer; no byte: retried."""
    stall_timeout: float = Field(default=30.0, gt=0)
    """Seconds without a byte from the provider, once it answers, before a call counts as stalled."""
    call_timeout: float = Field(default=300.0, gt=0)
    """Seconds one model call may take in all, retries included (cuts a stream of keep-alive comments)."""
    retry_window: float = Field(default=20.0, ge=0)
    """Seconds after a call began in which a failure before any output is still retried (0: never)."""
    planning: str = "auto"
    """Plan surface: `auto` (native when the runtime declares PLANNING, else `write_todos`), `builtin`, `native`."""
    filesystem: str = "auto"
    """File surface: `auto` (native when the runtime declares VIRTUAL_FILESYSTEM, else 8 tools), `builtin`, `native`."""
    tool_output_offload_threshold: str = "8000"
    """Tool results longer than this many characters go to a workspace file (<= 0 disables; malformed: 8000)."""
    prompt_cache_key: str = "auto"
    """Send `prompt_cache_key`: `auto` (only to OpenAI, Azure OpenAI and loopback), `enabled`, `disabled`."""


class DispatchSettings(WorkerSettings):
    """Everything dispatch reads from the environment."""

    app: str = "examples.echo:app"
    """`module:attribute` of the `atmosphere.sdk.App` to serve."""
    app_dir: Path = Path()
    """Directory put first on `sys.path` before importing the app."""
    dispatch: DispatchOptions = DispatchOptions()
    ingress: AuthOptions = AuthOptions()
    """The agent endpoints' token grants (`ATMOSPHERE_INGRESS__AUTH_TOKENS`): gRPC accepts the same tokens."""
    llm: LlmSettings = Field(default_factory=LlmSettings)
    ai_harness_enabled: str = ""
    """App-wide harness switch: unset (declarations decide), `true`, or anything else = the kill switch."""
    ai_harness_exclude_paths: str = ""
    """Comma-separated endpoint paths the harness skips."""
    ai_harness_compaction: str = "sliding-window"
    """How history is kept within its bound: `sliding-window`, `summarizing` or `token-window`."""
    ai_harness_prompt_cache_default: str = ""
    """The policy seeded by the CACHE feature: `none`, `conservative` (when unset) or `aggressive`."""
    ai_compaction_recent_window: int = Field(default=6, ge=1, le=1000)
    """Messages `summarizing` keeps verbatim after its summary."""
