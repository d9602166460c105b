"""Dispatch's settings: the app, concurrency, the model provider (`LLM_*`) and gRPC.

The knobs an operator may get slightly wrong (a sampling value, a surface mode, a threshold)
are typed but lenient: a malformed value is logged and replaced by its fallback instead of
stopping the service, exactly as Atmosphere treats them. Only a value that cannot mean anything
safe (an unknown prompt-cache policy) is refused.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from atmosphere.config import AuthOptions, WorkerSettings
from atmosphere.dispatch.delta_coalescer import DEFAULT_MAX_CHARS, DEFAULT_WINDOW
from atmosphere.dispatch.harness import DEFAULT_OFFLOAD_THRESHOLD, SurfaceMode
from atmosphere.dispatch.permissions import ToolPermission, ToolPermissions
from atmosphere.sdk import PromptCache
from atmosphere.sdk._remote import AGENT_NAME, url_problem
from atmosphere.sdk.builtin_tools import DELEGATION_TIMEOUT
from atmosphere.sdk.compaction import DEFAULT_STRATEGY, Strategy, parse_strategy
from atmosphere.sdk.host import HarnessSwitch
from atmosphere.sdk.runtime import RUNTIME_NAME

log = logging.getLogger("atmosphere.dispatch")

RUN_ACK_WAIT = 4.0
"""The default ack wait: a dead worker's run is taken over within seconds. In either mode the
journal fences a worker that only stalled (the successor's lease), so it need not be longer."""


class DispatchOptions(BaseModel):
    """`ATMOSPHERE_DISPATCH__*`."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    max_concurrent_runs: int = Field(default=16, ge=1, le=4096)
    """Runs this instance executes at once, per nesting level (top-level runs, and sub-runs one,
    two and three levels down each have this many); more wait in `ATMO_RUNS` for a free worker."""
    run_ack_wait: float = Field(default=RUN_ACK_WAIT, ge=1)
    """Seconds without a heartbeat after which JetStream hands a run to another worker: how soon a
    run whose worker died is taken over. A worker that only stalled this long (across a broker
    freeze, say) is fenced by its successor's lease in the run's journal, with or without durable
    runs: it starts no tool call and, within a second, writes no event."""
    run_heartbeat: float = Field(default=1.0, gt=0)
    """Seconds between the heartbeats (in-progress acknowledgements) of a run being worked on;
    keep it well under `run_ack_wait`."""
    grpc_host: str = "0.0.0.0"
    """Interface of the gRPC `DispatchService`."""
    grpc_port: int = Field(default=50051, ge=0, le=65535)
    """Port of the gRPC `DispatchService` (0 picks a free one; it is shown in the info)."""
    grpc_max_streams_per_client: int = Field(default=256, ge=1)
    """gRPC `Run` and `Follow` calls one client streams at once; beyond it `RESOURCE_EXHAUSTED`.
    A client is a token's user, or an anonymous caller's address."""
    grpc_max_streams: int = Field(default=4096, ge=1)
    """gRPC `Run` and `Follow` calls this process streams at once, for every client together."""
    governance_timeout: float = Field(default=5.0, gt=0)
    """Seconds to wait for governance; no answer means the request is refused (fail-closed)."""
    approval_timeout: float = Field(default=300.0, gt=0)
    """Seconds a tool that needs approval waits for the decision."""
    memory_model_timeout: float = Field(default=30.0, gt=0, le=600)
    """Seconds a summarizing (compaction) or fact-extraction model call may take; then the local
    summary is used, or no fact is extracted."""
    max_run_deliveries: int = Field(default=5, ge=1, le=100)
    """Deliveries of one run (its worker died, or failed, each time) after which it is ended
    with an error instead of being tried again: a run that crashes its worker cannot do so forever."""
    pool: str = Field(default="", pattern=RUNTIME_NAME.pattern + "|")
    """The runtime pool this instance serves: empty, the default pool (the agents pinned to no
    runtime), or a runtime's name (`langchain`): then only the agents pinned to that runtime
    (`@agent(runtime="langchain")`, `hosted_agent`), run by it, from that pool's own queue."""
    text_delta_window_ms: float = Field(default=DEFAULT_WINDOW * 1000, ge=0, le=1000)
    """Milliseconds within which a run's later text deltas are joined into one event, when the
    model streams faster than that: the first delta of a run (and every delta of a slower model)
    goes out at once, later ones at most once per window — one bus message, stored event, tape row
    and client frame instead of many. The text is the same either way. 0: every delta is its own event."""
    text_delta_max_chars: int = Field(default=DEFAULT_MAX_CHARS, ge=1, le=65536)
    """Characters of joined text held at most: at this many they go out before the window ends."""
    runtime: str = Field(default="", pattern=RUNTIME_NAME.pattern + "|")
    """The runtime the default pool runs its agents on; empty or `auto`: the highest-priority
    available one (an installed adapter before the built-in runtime; between equals, the first by
    name). A pool always runs its own runtime. `atmosphere dev` sets `built-in` unless told otherwise."""
    pools: Annotated[tuple[str, ...], NoDecode] = ()
    """Every runtime pool of the deployment, comma-separated (`langchain,anthropic`): the
    provisioner makes each one's queue. A pool's own name is always included."""

    @field_validator("pools", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(p.strip() for p in value.split(",") if p.strip())
        return value

    @field_validator("pools")
    @classmethod
    def _runtime_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for pool in value:
            if not RUNTIME_NAME.fullmatch(pool):
                msg = f"a pool is a runtime's name (1-32 lower-case letters, digits, '_' or '-'), got {pool!r}"
                raise ValueError(msg)
        return tuple(sorted(set(value)))

    def all_pools(self) -> tuple[str, ...]:
        """The runtime pools whose queues exist: `pools` and this instance's own."""
        return tuple(sorted({*self.pools, self.pool} - {""}))


class ToolOptions(BaseModel):
    """`ATMOSPHERE_TOOLS__*`: the operator's say over the agents' tools."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    permissions: dict[str, ToolPermission] = Field(default_factory=dict)
    """JSON object of tool name or `fnmatch` glob to `deny` (never run) or `confirm` (run once a
    human approved), e.g. `{"delete_*": "deny", "send_email": "confirm"}`. Any other value
    stops dispatch at start, naming the key."""

    @field_validator("permissions", mode="before")
    @classmethod
    def _known_permissions(cls, value: object) -> object:
        # Unlike the lenient knobs, a typo here must not silently let a tool run: refused at start.
        if not isinstance(value, dict):
            return value
        checked: dict[str, ToolPermission] = {}
        for key, permission in value.items():
            if not isinstance(key, str) or not key.strip():
                msg = f"a tool permission's key must be a tool name or glob, got {key!r}"
                raise ValueError(msg)
            try:
                checked[key.strip()] = ToolPermission(str(permission).strip().lower())
            except ValueError:
                msg = f"the permission of {key!r} must be 'deny' or 'confirm', got {permission!r}"
                raise ValueError(msg) from None
        return checked

    @property
    def policy(self) -> ToolPermissions:
        """The permissions as the choke point reads them."""
        return ToolPermissions(self.permissions)


class RemoteAgentSetting(BaseModel):
    """Where the deployment reaches one remote fleet member, and how it logs in."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    url: str = ""
    """Its A2A base URL, replacing the one the app declared (empty: the declared one)."""
    token: SecretStr = SecretStr("")
    """Sent as `Authorization: Bearer <token>` to it (card and messages); empty: none."""

    @field_validator("url")
    @classmethod
    def _plain_http(cls, value: str) -> str:
        problem = url_problem(value) if value else None
        if problem is not None:
            raise ValueError(problem)
        return value


class DelegationOptions(BaseModel):
    """`ATMOSPHERE_DELEGATION__*`: `delegate_task` to remote A2A agents (a coordinator's `RemoteAgent`s)."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    remotes: dict[str, RemoteAgentSetting] = Field(default_factory=dict)
    """JSON object of remote member name to `{"url"?, "token"?}`, e.g. `{"researcher": {"url":
    "https://b.example/atmosphere/a2a/researcher", "token": "..."}}`: where the deployment reaches
    a `RemoteAgent` the app declared and the bearer token it sends it. It may move a declared
    member, never add one: a name no coordinator declares is ignored (logged)."""
    remote_timeout: float = Field(default=DELEGATION_TIMEOUT, gt=0, le=DELEGATION_TIMEOUT)
    """Seconds one remote delegation may take in all (card, message, answer); then its task is
    cancelled. At most 120, the deadline of every `delegate_task` call."""
    remote_connect_timeout: float = Field(default=10.0, gt=0, le=300)
    """Seconds to open a connection to a remote agent."""
    remote_max_bytes: int = Field(default=8 * 1024 * 1024, ge=64 * 1024, le=256 * 1024 * 1024)
    """Bytes one remote delegation may read (its Agent Card and its whole event stream); beyond,
    the call fails and the remote task is cancelled. The answer the model gets is cut further, to
    what one run event carries, as every tool result is."""

    @field_validator("remotes")
    @classmethod
    def _agent_names(cls, value: dict[str, RemoteAgentSetting]) -> dict[str, RemoteAgentSetting]:
        for name in value:
            if not AGENT_NAME.fullmatch(name):
                msg = f"a remote agent's name is 1-64 letters, digits, '_' or '-', got {name!r}"
                raise ValueError(msg)
        return value


def _number(name: str, value: object) -> float | None:
    """`value` as a number; blank is unset, and anything else that is not a number is ignored (logged)."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    text = str(value)
    if not text.strip():
        return None
    try:
        return float(text)
    except ValueError:
        log.warning("ignoring %s=%r: not a number", name, text)
        return None


def _clamped(name: str, value: object, low: float, high: float) -> float | None:
    """A number kept within [low, high]: out of range is clamped (logged), malformed is ignored."""
    number = _number(name, value)
    if number is not None and not low <= number <= high:
        log.warning("clamping %s=%s to [%.1f, %.1f]", name, number, low, high)
        number = min(high, max(low, number))
    return number


def _positive_int(name: str, value: object) -> int | None:
    """A positive integer; zero, negative and fractional values are ignored (logged)."""
    number = _number(name, value)
    if number is None:
        return None
    if not number.is_integer() or number <= 0:
        log.warning("ignoring %s=%r: not a positive integer", name, value)
        return None
    return int(number)


def _offload_threshold(value: object) -> int:
    """Characters above which a tool result is offloaded; malformed: the default (logged)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = "" if value is None else str(value)
    try:
        return int(text.strip())
    except ValueError:
        if text.strip():
            log.warning("malformed tool-output offload threshold %r: using %d", text, DEFAULT_OFFLOAD_THRESHOLD)
        return DEFAULT_OFFLOAD_THRESHOLD


def _surface_mode(value: object) -> SurfaceMode:
    return value if isinstance(value, SurfaceMode) else SurfaceMode.parse(str(value))


def _entries(value: object) -> tuple[str, ...]:
    """Comma-separated text (or an already split collection) as its entries, blanks dropped."""
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list | tuple | set | frozenset):
        return ()
    return tuple(entry.strip() for entry in value if isinstance(entry, str) and entry.strip())


class LlmSettings(BaseSettings):
    """The model provider, with Atmosphere's `LLM_*` names.

    The generation knobs are sanitized as they are read: a malformed value is logged and
    ignored, an out-of-range one clamped, instead of stopping the service.
    """

    model_config = SettingsConfigDict(env_prefix="LLM_", frozen=True, extra="ignore", use_attribute_docstrings=True)

    base_url: str = ""
    """OpenAI-compatible base URL, e.g. `https://api.openai.com/v1`; unset: no model runtime."""
    api_key: str = ""
    """Sent as `Authorization: Bearer <key>` when set."""
    model: str = ""
    """Model name sent with every request."""
    temperature: float | None = None
    """Sampling temperature, clamped to [0.0, 2.0]; unset or malformed: the provider's default."""
    max_tokens: int | None = None
    """Most output tokens per model call; non-positive or malformed values are ignored."""
    top_p: float | None = None
    """Nucleus sampling, clamped to [0.0, 1.0]; unset or malformed: the provider's default."""
    stop: Annotated[tuple[str, ...], NoDecode] = ()
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
    planning: SurfaceMode = SurfaceMode.AUTO
    """Plan surface: `auto` (native when the runtime declares PLANNING, else `write_todos`), `builtin`, `native`."""
    filesystem: SurfaceMode = SurfaceMode.AUTO
    """File surface: `auto` (native when the runtime declares VIRTUAL_FILESYSTEM, else 8 tools), `builtin`, `native`."""
    tool_output_offload_threshold: int = DEFAULT_OFFLOAD_THRESHOLD
    """Tool results longer than this many characters go to a workspace file (<= 0 disables; malformed: 8000)."""
    prompt_cache_key: str = "auto"
    """Send `prompt_cache_key`: `auto` (only to OpenAI, Azure OpenAI and loopback), `enabled`, `disabled`."""

    @field_validator("temperature", mode="before")
    @classmethod
    def _sane_temperature(cls, value: object) -> float | None:
        return _clamped("LLM_TEMPERATURE", value, 0.0, 2.0)

    @field_validator("top_p", mode="before")
    @classmethod
    def _sane_top_p(cls, value: object) -> float | None:
        return _clamped("LLM_TOP_P", value, 0.0, 1.0)

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _sane_max_tokens(cls, value: object) -> int | None:
        return _positive_int("LLM_MAX_TOKENS", value)

    @field_validator("stop", mode="before")
    @classmethod
    def _split_stop(cls, value: object) -> tuple[str, ...]:
        return _entries(value)

    @field_validator("planning", "filesystem", mode="before")
    @classmethod
    def _lenient_surface(cls, value: object) -> SurfaceMode:
        # `built-in` means builtin; anything unknown is auto (never a startup failure).
        return _surface_mode(value)

    @field_validator("tool_output_offload_threshold", mode="before")
    @classmethod
    def _sane_threshold(cls, value: object) -> int:
        return _offload_threshold(value)


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
    tools: ToolOptions = ToolOptions()
    delegation: DelegationOptions = DelegationOptions()
    ai_harness_enabled: bool | None = None
    """App-wide harness switch: unset (declarations decide), `true`, or anything else = the kill switch."""
    ai_harness_exclude_paths: Annotated[frozenset[str], NoDecode] = frozenset()
    """Comma-separated endpoint paths the harness skips."""
    ai_harness_compaction: Strategy = DEFAULT_STRATEGY
    """How history is kept within its bound: `sliding-window`, `summarizing` or `token-window`."""
    ai_harness_prompt_cache_default: PromptCache | None = None
    """The policy seeded by the CACHE feature: `none`, `conservative` (when unset) or `aggressive`."""
    ai_compaction_recent_window: int = Field(default=6, ge=1, le=1000)
    """Messages `summarizing` keeps verbatim after its summary."""
    durable_runs_enabled: bool | None = None
    """`ATMOSPHERE_DURABLE_RUNS_ENABLED` (`atmosphere.durable-runs.enabled`): journal every model
    round, tool call and approval in `ATMO_JOURNAL`, so a run whose worker died continues on
    another with none repeated. Unset: on when the harness is explicitly enabled
    (`ATMOSPHERE_AI_HARNESS_ENABLED=true`), else off; an explicit `false` always wins."""
    durable_runs_retain_on_success: bool = False
    """Keep the journal of a run that succeeded (audit) instead of removing it at its end."""
    durable_runs_max_effects_per_run: int = Field(default=2000, ge=1, le=1_000_000)
    """Journaled effects one run may have; a run that needs more fails (nothing is dropped).
    Without durable runs only tool calls are journaled: it bounds a run's tool calls."""

    @property
    def durable_runs(self) -> bool:
        """Whether runs are journaled: explicit setting first, else implied by an explicit harness `true`."""
        if self.durable_runs_enabled is not None:
            return self.durable_runs_enabled
        return self.ai_harness_enabled is True

    @field_validator("ai_harness_enabled", mode="before")
    @classmethod
    def _tri_state_switch(cls, value: object) -> bool | None:
        return value if isinstance(value, bool) else HarnessSwitch.parse_enabled(None if value is None else str(value))

    @field_validator("ai_harness_exclude_paths", mode="before")
    @classmethod
    def _split_paths(cls, value: object) -> frozenset[str]:
        return HarnessSwitch.parse_paths(value) if isinstance(value, str) else frozenset(_entries(value))

    @field_validator("ai_harness_compaction", mode="before")
    @classmethod
    def _known_strategy(cls, value: object) -> Strategy:
        # An unknown name is sliding-window, with a warning (the SDK's one parser).
        return parse_strategy(None if value is None else str(value))

    @field_validator("ai_harness_prompt_cache_default", mode="before")
    @classmethod
    def _cache_policy(cls, value: object) -> PromptCache | None:
        # Unknown values are refused (a ValueError here is an invalid setting): no safe guess exists.
        return value if isinstance(value, PromptCache) else PromptCache.parse(None if value is None else str(value))
