"""The `AgentRuntime` SPI: how dispatch drives a model framework for one run.

Runtimes are discovered through the entry-point group `atmosphere.runtimes`; among those whose
`is_available()` is true, the highest `priority` wins. A runtime streams through the
`StreamingSession` it is given, calls tools only through `ctx.run_tool` (the one choke point
that governs, times out, journals and reports every tool call), reports usage with
`session.usage()`, and must be cancellable: when dispatch cancels the task running `execute`,
every upstream request is closed as the cancellation unwinds.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import logging
import os
import re
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, ClassVar, Protocol

from atmosphere.sdk._capability import AiCapability
from atmosphere.sdk._policies import RetryPolicy, ToolLoopPolicy
from atmosphere.sdk._request import AiRequest
from atmosphere.sdk._session import StreamingSession, TokenUsage
from atmosphere.sdk._tool import DEFAULT_TOOL_TIMEOUT, Tool, ToolKind
from atmosphere.sdk.lifecycle import AgentLifecycleListener

ENTRY_POINT_GROUP = "atmosphere.runtimes"

RUNTIME_NAME = re.compile(r"[a-z0-9][a-z0-9_\-]{0,31}")
"""A runtime's name (`built-in`, `langchain`): also its dispatch pool's, in subjects and consumer names."""

log = logging.getLogger("atmosphere.sdk")


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as a runtime offers it to the model."""

    name: str
    description: str
    parameters: dict[str, Any]
    kind: ToolKind = ToolKind.OTHER
    timeout: float = DEFAULT_TOOL_TIMEOUT
    requires_approval: bool = False
    idempotent: bool = False
    """See `Tool.idempotent`: whether a call interrupted by a worker's death may be run again."""

    @classmethod
    def of(cls, tool: Tool[Any, Any]) -> ToolSpec:
        """The spec of an SDK `Tool`."""
        return cls(
            name=tool.name,
            description=tool.description,
            parameters=tool.parameters,
            kind=tool.kind,
            timeout=tool.timeout,
            requires_approval=tool.requires_approval,
            idempotent=tool.idempotent,
        )


LocalTool = Callable[[str], Awaitable[str]]
"""Runs a hosted framework object's own tool in dispatch's process: the (possibly approval-edited)
arguments as JSON in, the text for the model out (an `Error: ...` text when it failed)."""


@dataclass(frozen=True, slots=True)
class ToolCallRequest:
    """A tool call the model asked for."""

    call_id: str
    name: str
    arguments_json: str
    local: LocalTool | None = None
    """Set for a tool of a hosted framework object (`AgentRuntime.native_tools`): the choke point
    runs every gate (validation, governance, approval, journal, screening) and then this, where an
    app's `@tool` would run in the sandbox."""


ToolRunner = Callable[[ToolCallRequest], Awaitable[str]]
"""Runs one tool call through dispatch's choke point and returns the text for the model."""

ClientCallGate = Callable[[ToolCallRequest], Awaitable[str | None]]
"""Checks a call of the caller's own function at dispatch's choke point (validation, governance,
permissions): None when it is handed back to the caller, else the refusal text for the model."""


@dataclass(frozen=True, slots=True)
class RecordedToolCall:
    """A tool call as a recorded model round asked for it."""

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class StreamedPiece:
    """One piece of a round as it streamed: answer text, or a fragment of a tool call's arguments."""

    text: str = ""
    call_id: str = ""
    """Set for a tool-call fragment (then `name` and `fragment` are too)."""
    name: str = ""
    fragment: str = ""


@dataclass(frozen=True, slots=True)
class RecordedRound:
    """One model round as the effect journal keeps it: enough to replay it without the model."""

    text: str = ""
    tool_calls: tuple[RecordedToolCall, ...] = ()
    finish_reason: str | None = None
    usage: TokenUsage | None = None
    pieces: tuple[StreamedPiece, ...] = ()
    """How it streamed, so that a replay sends the same events (empty: the text in one piece)."""

    def without_pieces(self) -> RecordedRound:
        """The round with its text in one piece (a smaller record)."""
        return dataclasses.replace(self, pieces=())

    def to_json(self) -> str:
        """The journal's payload (Atmosphere's RecordedRound: assistantText, toolCalls, usage; plus pieces)."""
        usage = self.usage
        return json.dumps(
            {
                "assistantText": self.text,
                "toolCalls": [{"id": c.call_id, "name": c.name, "arguments": c.arguments} for c in self.tool_calls],
                "finishReason": self.finish_reason,
                "usage": None if usage is None else dataclasses.asdict(usage),
                "pieces": [[p.text] if not p.call_id else [p.text, p.call_id, p.name, p.fragment] for p in self.pieces],
            },
            separators=(",", ":"),
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, text: str) -> RecordedRound:
        """Read a payload of `to_json`; `ValueError` when it is not one."""
        try:
            data = json.loads(text)
            calls = tuple(
                RecordedToolCall(str(c["id"]), str(c["name"]), str(c["arguments"])) for c in data["toolCalls"]
            )
            usage = data.get("usage")
            pieces = tuple(StreamedPiece(*(str(part) for part in piece)) for piece in data.get("pieces") or ())
            return cls(
                text=str(data["assistantText"]),
                tool_calls=calls,
                finish_reason=data.get("finishReason"),
                usage=TokenUsage(**usage) if isinstance(usage, dict) else None,
                pieces=pieces,
            )
        except (TypeError, KeyError, AttributeError) as exc:
            msg = f"not a recorded round: {exc}"
            raise ValueError(msg) from exc


class JournaledRound(Protocol):
    """One model round under the effect journal: replayed if it was committed, else run live."""

    @property
    def recorded(self) -> RecordedRound | None:
        """The committed round to replay (no model call), or None: call the model."""

    async def commit(self, result: RecordedRound) -> None:
        """Record a round that ran live, once its whole answer was consumed."""


class ModelRounds(Protocol):
    """The journal's view of a run's model rounds (`AgentExecutionContext.rounds`)."""

    async def next_round(self) -> JournaledRound:
        """The run's next round (rounds are counted across the whole run)."""


@dataclass(frozen=True, slots=True)
class GenerationOptions:
    """Sampling knobs; `None` leaves the provider's default (and the request body) untouched."""

    temperature: float | None = None
    max_tokens: int | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """How a runtime reaches its model provider (dispatch builds it from `LLM_*`)."""

    base_url: str | None = None
    api_key: str | None = None
    model: str = ""
    generation: GenerationOptions = field(default_factory=GenerationOptions)
    connect_timeout: float = 5.0
    """Seconds to open a connection to the provider (each attempt)."""
    first_byte_timeout: float = 10.0
    """Seconds an attempt waits for the first byte of the provider's answer (headers alone do not count)."""
    stall_timeout: float = 30.0
    """Seconds without a byte from the provider before the call counts as stalled."""
    call_timeout: float = 300.0
    """Seconds one model call may take in all, its retries included; a stream that only sends
    keep-alive comments is cut here."""
    retry_window: float = 20.0
    """Seconds after a call began during which a failed attempt may still be retried: a provider
    that never answers fails within this plus one `first_byte_timeout`."""
    max_concurrency: int = 16
    """Concurrent model calls this process makes (sizes the connection pool)."""
    prompt_cache_key: str = "auto"
    """When to send a request's cache key: `auto` (only to hosts known to accept it), `enabled`, `disabled`."""
    extra: dict[str, str] = field(default_factory=dict)
    """Settings for third-party runtimes."""


@dataclass(frozen=True, slots=True)
class AgentExecutionContext:
    """Everything a runtime needs for one run."""

    run_id: str
    agent: str
    conversation_id: str
    request: AiRequest
    tools: tuple[ToolSpec, ...] = ()
    """The tools to offer the model."""
    store_tools: tuple[ToolSpec, ...] = ()
    """The platform's stores behind a surface this runtime provides natively (it declares
    `PLANNING` or `VIRTUAL_FILESYSTEM`): `write_todos`, the file tools. Never offered to the model,
    which plans (or files) the runtime's own way; the runtime writes what its surface holds through
    them with `run_tool`, so the plan's `plan-update` events, the admin API and the tape follow it."""
    run_tool: ToolRunner | None = None
    tool_loop: ToolLoopPolicy = ToolLoopPolicy.DEFAULT
    retry: RetryPolicy = RetryPolicy.DEFAULT
    structured_output_retries: int = 0
    native: object | None = None
    """The user's own framework object this agent hosts (`atmosphere.sdk.hosted_agent`): run it
    (its own prompt, tools and loop) instead of building one from `request` and `tools`; its tools
    pass `run_tool` with `ToolCallRequest.local` set."""
    client_tools: tuple[ToolSpec, ...] = ()
    """The caller's own functions (an OpenAI door's `tools`), offered beside `tools` by a runtime
    declaring `CLIENT_TOOLS`. They are never run here: a round calling any ends the run with those
    calls handed back (`Complete.client_tool_calls`, finish reason `tool_calls`), each first passed
    through `pass_to_client`; the agent's own calls of that round are not run (their results
    would reach nobody: the model asks again once the caller's results are in)."""
    tool_choice: str | Mapping[str, Any] | None = None
    """The caller's `tool_choice` (`auto`, `none`, `required` or one function), sent as it is."""
    pass_to_client: ClientCallGate | None = None
    listeners: tuple[AgentLifecycleListener, ...] = ()
    """Observers of each model call (`atmosphere.sdk.lifecycle`): the runtime calls
    `notify_model_start`/`_end`/`_error` around every call it sends (not a replayed round)."""
    rounds: ModelRounds | None = None
    """Present in a durable run: before each model round a runtime asks `rounds.next_round()`;
    a recorded round is replayed (its text sent, its usage reported, its tool calls run through
    `run_tool`, which replays them too) instead of calling the model, and a live round is
    committed once consumed. A runtime that ignores it calls the model again on a resume."""


class AgentRuntime(abc.ABC):
    """One way of running a model for an agent."""

    name: ClassVar[str]
    priority: ClassVar[int] = 0
    environment: ClassVar[tuple[str, ...]] = ()
    """Environment variables of its own it reads (e.g. `ANTHROPIC_API_KEY`): `discover_runtimes` puts
    those that are set in its `RuntimeConfig.extra`, so settings stay environment variables only."""

    def __init__(self, config: RuntimeConfig) -> None:
        """Create the runtime; it may open connections lazily."""
        self.config = config

    @abc.abstractmethod
    def is_available(self) -> bool:
        """Whether this runtime can serve requests with its configuration."""

    def unavailable_reason(self) -> str:
        """Why `is_available()` is false, in words that name the fix (shown as `INACTIVE(<reason>)`)."""
        return ""

    @abc.abstractmethod
    def capabilities(self) -> frozenset[AiCapability]:
        """What it can do: each flag must be pinned by the runtime contract suite."""

    @abc.abstractmethod
    async def execute(self, ctx: AgentExecutionContext, session: StreamingSession) -> None:
        """Run one request, streaming into `session` and ending it with `complete` or `error`."""

    @classmethod
    def hosts(cls, native: object) -> bool:
        """Whether `native` is a framework object this runtime can host (`hosted_agent`)."""
        del native
        return False

    def native_tools(self, native: object) -> tuple[ToolSpec, ...]:
        """The tools a hosted object may call, as specs: what the choke point validates and governs."""
        del native
        return ()

    async def list_models(self) -> list[str]:
        """The provider's models (runtimes declaring `MODEL_ENUMERATION`)."""
        return []

    async def aclose(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Release connections (called once when dispatch stops)."""


def framework_object(native: object, module: str, name: str) -> bool:
    """Whether `native` is an instance of `module`'s class `name`, without importing `module`.

    What a runtime's `hosts` asks: an object of a framework exists only once the framework was
    imported, so a framework not imported yet means no, at no cost. A runtime's entry point must
    not import its framework: every dispatch loads every installed runtime when it starts, and a
    framework takes seconds to import.
    """
    loaded = sys.modules.get(module)
    cls = getattr(loaded, name, None) if loaded is not None else None
    return isinstance(cls, type) and isinstance(native, cls)


def discover_runtimes(config: RuntimeConfig, environ: Mapping[str, str] | None = None) -> list[AgentRuntime]:
    """Instantiate every runtime registered under `atmosphere.runtimes`.

    Each gets `config` with the variables of `environ` (default: the process's) it declares in
    `environment` added to `extra`.
    """
    environ = os.environ if environ is None else environ
    runtimes: list[AgentRuntime] = []
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            cls = entry.load()
            own = {name: environ[name] for name in getattr(cls, "environment", ()) if name in environ}
            runtimes.append(cls(dataclasses.replace(config, extra={**own, **config.extra}) if own else config))
        except Exception:
            log.exception("runtime %s failed to load; skipping it", entry.name)
    return runtimes


def resolve_runtime(runtimes: Iterable[AgentRuntime]) -> AgentRuntime | None:
    """The highest-priority available runtime, or None; between equal priorities, the first by name.

    Ties are common (every framework adapter has priority 100): the order of installation must
    not decide which one runs an app's agents.
    """
    available = sorted((r for r in runtimes if r.is_available()), key=lambda r: r.name)
    return max(available, key=lambda r: r.priority, default=None)
