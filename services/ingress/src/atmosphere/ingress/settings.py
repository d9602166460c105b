"""Ingress's settings: where it listens, connection bounds, auth, CORS, the OpenAI endpoint.

Atmosphere's own keys keep their names as flat variables: `atmosphere.ai.openai.enabled` is
`ATMOSPHERE_AI_OPENAI_ENABLED`, `atmosphere.admin.http-read-auth-required` is
`ATMOSPHERE_ADMIN_HTTP_READ_AUTH_REQUIRED`.
"""

from __future__ import annotations

import json
import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, field_validator
from pydantic_settings import NoDecode

from atmosphere.config import ServiceSettings, TokenGrant

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""A tool name `ATMOSPHERE_MCP__TOOLS` may list."""


class IngressOptions(BaseModel):
    """`ATMOSPHERE_INGRESS__*`."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    host: str = "127.0.0.1"
    """Interface to listen on; use 0.0.0.0 in a container."""
    port: int = Field(default=8080, ge=0, le=65535)
    """HTTP and WebSocket port (0 picks a free one; it is logged and shown in the info)."""
    max_message_bytes: int = Field(default=1 << 20, ge=1024)
    """Largest inbound WebSocket message or HTTP prompt body; larger ones are refused."""
    max_prompts_per_connection: int = Field(default=4, ge=1, le=256)
    """Prompts one connection may have running at once."""
    send_queue_frames: int = Field(default=1024, ge=16)
    """Frames buffered per connection; a client further behind is closed (4008) and may resume."""
    long_poll_max_wait: float = Field(default=30.0, gt=0, le=120)
    """The longest a long-poll request waits for frames."""
    auth_tokens: tuple[TokenGrant, ...] = ()
    """JSON list of token grants (dispatch's gRPC reads it too); when empty, agent endpoints are anonymous."""
    cors_origins: tuple[str, ...] = ()
    """JSON list of origins allowed to call from a browser (`["*"]` for any)."""
    conversation_idle_timeout: float = Field(default=1800.0, gt=0)
    """Seconds without a prompt after which a conversation counts as closed (long-term facts are extracted)."""
    max_header_bytes: int = Field(default=32 * 1024, ge=1024, le=1 << 20)
    """Largest request head (request line and headers together); a larger one is answered 431."""
    max_request_line_bytes: int = Field(default=8 * 1024, ge=256, le=1 << 20)
    """Largest request line (method, path and query); a longer one is answered 414."""
    first_byte_timeout: float = Field(default=10.0, gt=0)
    """Seconds a new connection may stay silent before it is closed."""
    header_timeout: float = Field(default=10.0, gt=0)
    """Seconds from a request's first byte until its headers must be complete (slow clients get 408)."""
    body_timeout: float = Field(default=30.0, gt=0)
    """Seconds from a request's headers until its body must be complete (slow clients get 408)."""
    keep_alive_timeout: float = Field(default=5.0, gt=0)
    """Seconds an idle keep-alive HTTP connection stays open."""
    admin_timeout: float = Field(default=5.0, gt=0, le=300)
    """Seconds an admin or workspace read (or a governance change) waits for the owning service
    (memory, tape, governance) before answering 503 `admin.unavailable`."""
    max_connections: int = Field(default=4096, ge=1)
    """Open connections (HTTP and WebSocket) per ingress process; beyond it requests get 503."""
    sse_keep_alive: float = Field(default=15.0, gt=0, le=3600)
    """Seconds an SSE stream may stay quiet before a `: keep-alive` comment, so proxies keep it open."""
    drain_grace: float = Field(default=20.0, ge=2, le=600)
    """Seconds a stopping ingress (SIGTERM) gives open streams to end before it exits, after its
    pre-stop delay (the two below the orchestrator's grace: 35 s in the manifests)."""
    pre_stop_delay: float = Field(default=0.0, ge=0, le=300)
    """Seconds a stopping ingress (SIGTERM) first goes on serving, new connections included, with
    `/readyz` answering 503, before it stops accepting and drains: the time an orchestrator takes
    to take it out of its endpoints (Kubernetes: a few seconds). 0: stop accepting at once."""
    max_streams_per_client: int = Field(default=256, ge=1)
    """Runs one client follows at once (WebSocket runs and resumes, SSE streams and resumes, long-poll
    waits); beyond it 429. A client is a token's user, or an anonymous caller's address."""
    max_streams: int = Field(default=8192, ge=1)
    """Runs this ingress process follows at once, for every client together; beyond it 429."""
    ws_idle_timeout: float = Field(default=300.0, gt=0)
    """Seconds a WebSocket with no run streaming may go without a message from its client; then it is closed (1001)."""
    ws_ping_interval: float = Field(default=20.0, gt=0, le=3600)
    """Seconds between WebSocket pings to each client (keeps proxies from cutting a quiet socket)."""
    ws_ping_timeout: float = Field(default=20.0, gt=0, le=3600)
    """Seconds a client has to answer a ping before its socket counts as dead and is closed."""
    access_log: bool = True
    """One line per HTTP request and per WebSocket connection (method, path without its query,
    status, duration, the run) on the `atmosphere.ingress.access` logger at INFO."""


class McpOptions(BaseModel):
    """`ATMOSPHERE_MCP__*`: the MCP door (every agent an MCP tool, at `/atmosphere/mcp`)."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    enabled: bool = True
    """Serve the MCP door (with the same token grants as the agent endpoints); it is served only
    where the `mcp` SDK is installed (ingress's `mcp` extra), which the info says."""
    max_sessions: PositiveInt = 1000
    """Stateful MCP sessions (the 2025 protocol era) one ingress process keeps at once: a client
    opening one more gets a 503 until a session ends or idles out (each holds memory until then)."""
    session_idle_seconds: PositiveFloat = 600.0
    """A stateful session with no request in flight for this long is closed (its id then answers 404)."""
    tools: Annotated[tuple[str, ...], NoDecode] = ()
    """The app's `@tool`s the door also exposes, each as the MCP tool `<agent>__<tool>` of every agent
    that has it: tool names (a JSON list, or comma-separated), `*` for all; none when empty."""

    @field_validator("tools", mode="before")
    @classmethod
    def _names(cls, value: object) -> object:
        # `read_note,delete_note` or `*` reads better in an environment than JSON.
        if isinstance(value, str):
            text = value.strip()
            return json.loads(text) if text.startswith("[") else [n.strip() for n in text.split(",") if n.strip()]
        return value

    @field_validator("tools")
    @classmethod
    def _valid(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if name != "*" and not TOOL_NAME.fullmatch(name):
                msg = f"{name!r} is no tool name (1-64 letters, digits, '_' or '-'; or '*' for every tool)"
                raise ValueError(msg)
        return value


class AgUiOptions(BaseModel):
    """`ATMOSPHERE_AG_UI__*`: the AG-UI door (`POST /atmosphere/ag-ui/<agent>`)."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    enabled: bool = True
    """Serve the AG-UI door (with the same token grants as the agent endpoints); it is served only
    where the `ag-ui-protocol` SDK is installed (ingress's `ag-ui` extra), which the info says."""


class A2aOptions(BaseModel):
    """`ATMOSPHERE_A2A__*`: the A2A door (each agent an A2A server at `/atmosphere/a2a/<agent>`)."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    enabled: bool = True
    """Serve the A2A door (with the same token grants as the agent endpoints); it is served only
    where the `a2a-sdk` is installed (ingress's `a2a` extra), which the info says."""
    default_agent: str = ""
    """The agent whose Agent Card is also served at `/.well-known/agent-card.json` (none when empty)."""


class IngressSettings(ServiceSettings):
    """Everything ingress reads from the environment."""

    ingress: IngressOptions = IngressOptions()
    mcp: McpOptions = McpOptions()
    ag_ui: AgUiOptions = AgUiOptions()
    a2a: A2aOptions = A2aOptions()
    ai_openai_enabled: bool = False
    """Serve the OpenAI-compatible API at `/atmosphere/v1`."""
    ai_openai_models: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    """`model=agent` pairs, comma-separated; when set, only these models are served."""
    ai_openai_default_agent: str = ""
    """The agent serving a blank or unmapped `model`; unset: unknown models get 404."""
    ai_openai_api_key: str = ""
    """When set, the OpenAI API requires `Authorization: Bearer <key>` (401 otherwise)."""
    ai_openai_max_concurrent: int = Field(default=64, ge=1)
    """Completions served at once; more get 503."""
    ai_openai_timeout: float = Field(default=120.0, gt=0)
    """Seconds a completion may take."""
    ai_openai_retry_grace: float = Field(default=10.0, ge=0, le=600)
    """Seconds the run of a retryable completion (an `Idempotency-Key`, an SDK's request) goes on
    after its client left before the answer started, for a retry to attach; then it is cancelled."""
    admin_http_read_auth_required: bool = True
    """Require `ATMOSPHERE_ADMIN_TOKEN` on every `/api/admin/*` read."""
    admin_token: str = ""
    """The admin token (`Authorization: Bearer <token>`); unset with auth required: admin reads are refused."""

    @field_validator("ai_openai_models", mode="before")
    @classmethod
    def _pairs(cls, value: object) -> object:
        # `gpt-4o=assistant,echo=echo` reads better in an environment than JSON.
        if isinstance(value, str) and value.strip().startswith("{"):
            return json.loads(value)
        if isinstance(value, str):
            pairs = [p.split("=", 1) for p in value.split(",") if p.strip()]
            if any(len(p) != 2 or not p[0].strip() or not p[1].strip() for p in pairs):
                msg = "use model=agent pairs separated by commas"
                raise ValueError(msg)
            return {k.strip(): v.strip() for k, v in pairs}
        return value
