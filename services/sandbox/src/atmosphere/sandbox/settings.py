"""Sandbox's settings: the app whose tools it hosts, and how many calls and how large a result."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from atmosphere.bus.sizes import MAX_OBJECT_BYTES
from atmosphere.config import WorkerSettings
from atmosphere.sandbox.code.settings import CodeSettings
from atmosphere.sandbox.handlers import DEFAULT_MAX_RESULT_BYTES
from atmosphere.sandbox.js.settings import EvalSettings


class SandboxOptions(BaseModel):
    """`ATMOSPHERE_SANDBOX__*`."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    max_concurrent_calls: int = Field(default=64, ge=1, le=4096)
    """Tool calls this instance runs at once."""
    max_result_bytes: int = Field(default=DEFAULT_MAX_RESULT_BYTES, ge=1024, le=MAX_OBJECT_BYTES)
    """The largest tool result (UTF-8 bytes) passed on whole; a longer one is cut, with a marker.

    A result too large for one bus message travels through the object bucket `ATMO_TOOL_RESULTS`.
    """
    tool_workers: int = Field(default=2, ge=0, le=64)
    """Worker processes that run the app's `@tool` functions (a crashing, hanging or leaking tool
    costs its worker, not the service); 0 runs them inside the service process, for debugging."""
    tool_worker_memory_bytes: int = Field(default=1 << 30, ge=64 << 20)
    """The most memory one tool worker may use (a memory cgroup, else an RSS watchdog); over it, the
    worker is killed and its calls end with an error."""
    tool_worker_grace_seconds: float = Field(default=1.0, gt=0, le=60)
    """Seconds past a tool's timeout before its worker counts as wedged and is killed (a worker
    answers a timeout itself; this is for a tool that blocks the whole worker)."""
    mcp_connect_timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    """Seconds to open a session with a declared MCP server (spawn or connect, then the handshake);
    past it the server counts as not answering."""
    mcp_list_timeout_seconds: float = Field(default=5.0, gt=0, le=300)
    """Seconds an MCP server has to list its tools at a refresh; past it its tools are withdrawn."""
    mcp_refresh_seconds: float = Field(default=10.0, gt=0, le=3600)
    """Seconds between two listings of every MCP server: a server that stops answering drops out of
    the tools offered within about this time (plus the list timeout), and comes back as quickly."""
    mcp_max_tools: int = Field(default=128, ge=1, le=1024)
    """The most tools one MCP server may offer (the first ones it lists)."""


class SandboxSettings(WorkerSettings):
    """Everything sandbox reads from the environment."""

    app: str = "examples.echo:app"
    """`module:attribute` of the `atmosphere.sdk.App` whose `@tool` functions are hosted."""
    app_dir: Path = Path()
    """Directory put first on `sys.path` before importing the app."""
    sandbox: SandboxOptions = SandboxOptions()
    code: CodeSettings = Field(default_factory=CodeSettings)
    """`ATMOSPHERE_AI_CODE_*`: the `code_exec` tool (off unless enabled and an isolating backend works)."""
    eval: EvalSettings = Field(default_factory=EvalSettings)
    """`ATMOSPHERE_AI_EVAL_*`: the `eval` tool (JavaScript in a V8 worker process; off unless enabled)."""
