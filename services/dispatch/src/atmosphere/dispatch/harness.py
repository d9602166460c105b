"""What the harness attaches to each agent, and the runtime truth it reports.

Resolved once when dispatch starts: for every agent, the features it gets (the SDK's precedence
rules over the app-wide switch), the built-in tools that genuinely register (a user tool with
the same name wins), its workspace, its prompt-cache hint. The state map under
`/api/console/info` → `harness` is seeded as Atmosphere seeds it and only upgraded by what
genuinely attached.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from atmosphere.contracts.tool.v1.tool_pb2 import WorkspaceScope
from atmosphere.sdk import App, Harness, PromptCache
from atmosphere.sdk.builtin_tools import DELEGATE_TASK, FILE_TOOLS, MEMORY_TOOL_NAMES, TASK, WRITE_TODOS
from atmosphere.sdk.compaction import DEFAULT_STRATEGY, Strategy
from atmosphere.sdk.host import AgentSpec, AiCapability, HarnessSwitch
from atmosphere.sdk.runtime import ToolSpec

log = logging.getLogger("atmosphere.dispatch")

DEFAULT_OFFLOAD_THRESHOLD = 8000
"""Characters above which a tool result goes to a workspace file (`LLM_TOOL_OUTPUT_OFFLOAD_THRESHOLD`)."""
LONG_TERM_STORE = "memory-service"
"""How the long-term-memory state names its store: the memory service's SQLite fact store."""
DURABLE_RUNS_ACTIVE = "ACTIVE(jetstream)"
"""What `durable-runs` reports when the effect journal (`ATMO_JOURNAL`) is attached."""


class SurfaceMode(enum.StrEnum):
    """`LLM_PLANNING` / `LLM_FILESYSTEM`: which plan or file surface an agent gets."""

    AUTO = "auto"
    BUILTIN = "builtin"
    NATIVE = "native"

    @staticmethod
    def parse(text: str) -> SurfaceMode:
        """Lenient: `built-in` means builtin; anything unknown is auto."""
        value = text.strip().lower()
        if value in {"builtin", "built-in"}:
            return SurfaceMode.BUILTIN
        if value == "native":
            return SurfaceMode.NATIVE
        return SurfaceMode.AUTO


@dataclass(frozen=True, slots=True)
class HarnessConfig:
    """The app-wide harness settings (dispatch's `serve` builds it from the already parsed settings)."""

    switch: HarnessSwitch = field(default_factory=HarnessSwitch)
    compaction: Strategy = DEFAULT_STRATEGY
    recent_window: int = 6
    prompt_cache_default: PromptCache | None = None
    planning: SurfaceMode = SurfaceMode.AUTO
    filesystem: SurfaceMode = SurfaceMode.AUTO
    offload_threshold: int = DEFAULT_OFFLOAD_THRESHOLD


def workspace_category(kind: str) -> str:
    """The workspace subtree of an agent kind (Atmosphere's `agents|coordinators|endpoints`)."""
    return {"coordinator": "coordinators", "ai_endpoint": "endpoints"}.get(kind, "agents")


@dataclass(frozen=True)
class AgentHarness:
    """What the harness attached to one agent."""

    features: frozenset[Harness] = frozenset()
    conversation_memory: bool = False
    long_term_memory: bool = False
    prompt_cache: PromptCache = PromptCache.NONE
    cache_seeded: bool = False
    """Whether CACHE seeded `prompt_cache` (the declaration said NONE), as opposed to the agent's own choice."""
    max_history_messages: int = 20
    tools: Mapping[str, ToolSpec] = field(default_factory=dict)
    """The built-in tools that registered (user tools of the same name excluded)."""
    store_tools: Mapping[str, ToolSpec] = field(default_factory=dict)
    """The built-in tools of a surface the runtime provides natively (its own planning, its own
    files): never offered to the model, which sees one surface only, the runtime's; the runtime
    writes what its surface holds through them at the choke point, so the platform's store (the
    `plan-update` events, the admin API, the tape) stays the one record of it."""
    category: str = "agents"
    owner: str = "default"
    """The workspace owner: the agent's name, or an endpoint's path."""
    planning: str = ""
    filesystem: str = ""
    delegation: str = ""
    """Per-agent surface states (`ACTIVE(builtin)`, …); empty when the feature is off."""

    @property
    def has_files(self) -> bool:
        """Whether a file workspace is in scope (tool-output offload needs one)."""
        return any(name in self.tools or name in self.store_tools for name in ("write_file", "read_file"))

    @property
    def workspace_tools(self) -> frozenset[str]:
        """The names of the tools reaching the memory service's workspace, offered or bridged."""
        return frozenset(name for name in (*self.tools, *self.store_tools) if name in MEMORY_TOOL_NAMES)

    def scope(self, agent_id: str, conversation_id: str) -> WorkspaceScope:
        """The workspace of this agent in one conversation."""
        return WorkspaceScope(
            category=self.category, owner=self.owner, agent_id=agent_id, conversation_id=conversation_id
        )

    def attached(self) -> list[str]:
        """Feature names that genuinely attached, for the agent's descriptor.

        `planning` and `filesystem` mean the built-in, browsable surfaces (memory's store).
        """
        names = []
        if self.conversation_memory or self.long_term_memory:
            names.append("memory")
        if self.prompt_cache is not PromptCache.NONE and Harness.CACHE in self.features:
            names.append("cache")
        if self.delegation:
            names.append("delegation")
        if WRITE_TODOS.name in self.tools or WRITE_TODOS.name in self.store_tools:
            names.append("planning")
        if self.has_files:
            names.append("filesystem")
        return names


@dataclass(frozen=True, slots=True)
class _RuntimeView:
    """What the harness needs to know of the resolved runtime."""

    name: str
    capabilities: frozenset[AiCapability]


def _surface(
    mode: SurfaceMode,
    *,
    capability: AiCapability,
    runtime: _RuntimeView,
    builtin: Sequence[ToolSpec],
    user_tools: frozenset[str],
) -> tuple[str, dict[str, ToolSpec], dict[str, ToolSpec]]:
    """One surface (plans or files): its state, the built-in tools it offers, those it keeps.

    Kept: for a native surface, the built-in tools it writes through (`AgentHarness.store_tools`),
    never offered to the model (one surface only, the runtime's).
    """
    native = capability in runtime.capabilities
    registered = {t.name: t for t in builtin if t.name not in user_tools}
    if mode is SurfaceMode.NATIVE or (mode is SurfaceMode.AUTO and native):
        if native:
            return f"ACTIVE(native:{runtime.name})", {}, registered
        log.warning("%s is native-only but the runtime %s lacks it", capability.value, runtime.name or "(none)")
        return "INACTIVE(native-unavailable)", {}, {}
    if not registered:
        return "ACTIVE(user-tool)", {}, {}
    if len(registered) < len(builtin):
        return "ACTIVE(builtin,partial)", registered, {}
    return "ACTIVE(builtin)", registered, {}


def resolve_agent(
    spec: AgentSpec,
    config: HarnessConfig,
    *,
    runtime_name: str = "",
    runtime_capabilities: frozenset[AiCapability] = frozenset(),
) -> AgentHarness:
    """The harness of one agent."""
    features = frozenset() if spec.headless else config.switch.features_for(spec.path, spec.harness, kind=spec.kind)
    if spec.headless:
        log.info("agent %s is headless: the harness does not apply", spec.name)
    user_tools = frozenset(t.name for t in spec.tools)
    runtime = _RuntimeView(runtime_name, runtime_capabilities)
    planning, plan_tools, plan_store = _planning(features, config, runtime, user_tools)
    filesystem, file_tools, file_store = _filesystem(features, config, runtime, user_tools)
    delegation, delegation_tools = _delegation(spec, features, user_tools)
    prompt_cache, cache_seeded = _prompt_cache(spec, features, config)
    return AgentHarness(
        features=features,
        # MEMORY brings conversation memory (so `harness=[]` and the kill switch keep nothing);
        # an endpoint's own `conversation_memory=True` always wins.
        conversation_memory=Harness.MEMORY in features or (spec.kind == "ai_endpoint" and spec.conversation_memory),
        long_term_memory=Harness.MEMORY in features,
        prompt_cache=prompt_cache,
        cache_seeded=cache_seeded,
        max_history_messages=spec.max_history_messages,
        tools=plan_tools | file_tools | delegation_tools,
        store_tools=plan_store | file_store,
        category=workspace_category(spec.kind),
        # Memory makes the owner a safe directory name (`paths.sanitize_owner`).
        owner=spec.name if spec.kind != "ai_endpoint" else spec.path,
        planning=planning,
        filesystem=filesystem,
        delegation=delegation,
    )


def _planning(
    features: frozenset[Harness], config: HarnessConfig, runtime: _RuntimeView, user_tools: frozenset[str]
) -> tuple[str, dict[str, ToolSpec], dict[str, ToolSpec]]:
    """The plan surface's state and tools ("" and none when PLANNING is off)."""
    if Harness.PLANNING not in features:
        return "", {}, {}
    return _surface(
        config.planning,
        capability=AiCapability.PLANNING,
        runtime=runtime,
        builtin=[WRITE_TODOS],
        user_tools=user_tools,
    )


def _filesystem(
    features: frozenset[Harness], config: HarnessConfig, runtime: _RuntimeView, user_tools: frozenset[str]
) -> tuple[str, dict[str, ToolSpec], dict[str, ToolSpec]]:
    """The file surface's state and tools ("" and none when FILESYSTEM is off)."""
    if Harness.FILESYSTEM not in features:
        return "", {}, {}
    return _surface(
        config.filesystem,
        capability=AiCapability.VIRTUAL_FILESYSTEM,
        runtime=runtime,
        builtin=FILE_TOOLS,
        user_tools=user_tools,
    )


def _delegation(
    spec: AgentSpec, features: frozenset[Harness], user_tools: frozenset[str]
) -> tuple[str, dict[str, ToolSpec]]:
    """A coordinator's delegation state and tools (`delegate_task`, `task`); a user tool of the same name wins."""
    if Harness.DELEGATION not in features or spec.kind != "coordinator":
        return "", {}
    tools: dict[str, ToolSpec] = {}
    if DELEGATE_TASK.name in user_tools:
        state = "ACTIVE(user-tool)"
    else:
        state = "ACTIVE"
        tools[DELEGATE_TASK.name] = DELEGATE_TASK
    if TASK.name not in user_tools:
        tools[TASK.name] = TASK
    return state, tools


def _prompt_cache(spec: AgentSpec, features: frozenset[Harness], config: HarnessConfig) -> tuple[PromptCache, bool]:
    """The agent's cache policy, and whether CACHE seeded it (its own declaration said NONE)."""
    seeded = spec.prompt_cache is PromptCache.NONE and Harness.CACHE in features
    if not seeded:
        return spec.prompt_cache, False
    return config.prompt_cache_default or PromptCache.CONSERVATIVE, True


def resolve_app(
    app: App,
    config: HarnessConfig,
    *,
    runtime_name: str = "",
    runtime_capabilities: frozenset[AiCapability] = frozenset(),
) -> dict[str, AgentHarness]:
    """The harness of every agent of `app`."""
    return {
        name: resolve_agent(spec, config, runtime_name=runtime_name, runtime_capabilities=runtime_capabilities)
        for name, spec in app.agents.items()
    }


def runtime_state(
    config: HarnessConfig, agents: Mapping[str, AgentHarness], *, durable: bool = False
) -> dict[str, str]:
    """The `harness` block of `/api/console/info`: seeded, then upgraded by what attached."""
    on = config.switch.enabled is True
    inactive = "INACTIVE(no-endpoint)" if on else "INACTIVE(disabled)"
    if config.prompt_cache_default is not None:
        cache_seed = config.prompt_cache_default.value
    else:
        cache_seed = PromptCache.CONSERVATIVE.value if on else PromptCache.NONE.value
    state = {
        "conversation-memory": inactive,
        "long-term-memory": inactive,
        "prompt-cache-default": cache_seed,
        "compaction": config.compaction,
        "planning": inactive,
        "filesystem": inactive,
        "skills": "CONVENTION",
        # What this process really does: with the journal, a re-driven run replays its committed
        # rounds and tool calls; without it, a run whose worker dies is re-driven from its
        # prompt and its tool calls may run again.
        "durable-runs": DURABLE_RUNS_ACTIVE if durable else "INACTIVE(disabled)",
        "delegation": "INACTIVE(no-coordinator)" if on else "INACTIVE(disabled)",
    }
    for harness in agents.values():
        if harness.conversation_memory:
            state["conversation-memory"] = "ACTIVE"
        if harness.long_term_memory:
            state["long-term-memory"] = f"ACTIVE({LONG_TERM_STORE})"
        if harness.cache_seeded:
            # The default a NONE declaration got; an agent's own explicit policy is not "the default".
            state["prompt-cache-default"] = harness.prompt_cache.value
        if harness.planning:
            state["planning"] = harness.planning
        if harness.filesystem:
            state["filesystem"] = harness.filesystem
        if harness.delegation:
            state["delegation"] = harness.delegation
    return state


def subagent_harness() -> AgentHarness:
    """The `task` sub-agent's harness: only its plan and files (no memory, no delegation)."""
    return AgentHarness(
        features=frozenset({Harness.PLANNING, Harness.FILESYSTEM}),
        tools={t.name: t for t in (WRITE_TODOS, *FILE_TOOLS)},
        category="subagents",
        planning="ACTIVE(builtin)",
        filesystem="ACTIVE(builtin)",
    )
