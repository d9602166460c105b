"""What one run is given, fixed before it starts: the request, the agent, the services, the settings.

`RunServices` is what every run of a dispatch process shares; `AgentBinding` one served agent;
`RunScope` one run's fixed view of both — its request and principal, its agent (always one: a
request for an unknown agent never becomes a `Run`), its workspace and its permission mode,
each settled once when the run is made, so no step asks whether it is there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from atmosphere.bus import Bus
from atmosphere.contracts.run.v1.run_pb2 import RunSubmission
from atmosphere.contracts.tool.v1.tool_pb2 import WorkspaceScope
from atmosphere.dispatch.delegation import SUBAGENT, subagent_scope
from atmosphere.dispatch.delta_coalescer import DEFAULT_MAX_CHARS, DEFAULT_WINDOW
from atmosphere.dispatch.governance_client import GovernanceClient
from atmosphere.dispatch.harness import AgentHarness
from atmosphere.dispatch.journal import DEFAULT_MAX_EFFECTS
from atmosphere.dispatch.memory_client import MemoryClient
from atmosphere.dispatch.model_side import ModelSide
from atmosphere.dispatch.permissions import ToolPermissions, run_mode
from atmosphere.dispatch.remote_delegation import RemoteLimits, RemoteMember
from atmosphere.sdk import PermissionMode
from atmosphere.sdk.host import AgentSpec
from atmosphere.sdk.lifecycle import AgentLifecycleListener
from atmosphere.sdk.runtime import ToolSpec


@dataclass(frozen=True)
class ExecutorOptions:
    """Timeouts of the governed steps."""

    governance_timeout: float = 5.0
    approval_timeout: float = 300.0
    offload_threshold: int = 8000
    """Tool results longer than this go to the workspace (0 or less: never)."""
    max_deliveries: int = 5
    """A run delivered this many times is ended with an error instead of run again (a durable
    run: this many deliveries in a row that committed no effect)."""
    durable: bool = False
    """Journal every effect (`ATMOSPHERE_DURABLE_RUNS_ENABLED`): a re-driven run replays them."""
    owner: str = ""
    """Who this worker is, in the journal's leases."""
    max_effects: int = DEFAULT_MAX_EFFECTS
    """A durable run's bound on journaled effects (it fails beyond it)."""
    retain_on_success: bool = False
    """Keep a succeeded run's journal instead of removing it."""
    ack_wait: float = 4.0
    """Seconds without a heartbeat before another worker takes a run over."""
    tool_permissions: ToolPermissions = field(default_factory=ToolPermissions)
    """The operator's `deny`/`confirm` per tool (`ATMOSPHERE_TOOLS__PERMISSIONS`)."""
    agent_pools: Mapping[str, str] = field(default_factory=dict)
    """The dispatch pool of every agent of the app (its pinned runtime, "" the default pool),
    not only of those this pool serves: where a delegated sub-run is queued."""
    sandbox_tools_refresh: float = 5.0
    """Seconds the sandboxes' offer (`code_exec`, `eval`, MCP servers' tools) is read from
    `ATMO_TOOLS` at most once: a tool withdrawn there leaves new runs within this time."""
    remote_fleets: Mapping[str, Mapping[str, RemoteMember]] = field(default_factory=dict)
    """Each coordinator's remote A2A members (coordinator → name → member), as the deployment reaches them."""
    remote_limits: RemoteLimits = field(default_factory=RemoteLimits)
    """The bounds of every remote delegation (`ATMOSPHERE_DELEGATION__*`)."""
    listeners: tuple[AgentLifecycleListener, ...] = ()
    """The app's observers of model calls (`App(listeners=...)`, `atmosphere.sdk.lifecycle`)."""
    text_delta_window: float = DEFAULT_WINDOW
    """Seconds within which a run's later text deltas are joined into one event (0: never joined)."""
    text_delta_max_chars: int = DEFAULT_MAX_CHARS
    """Characters of text held at most before they go out, whatever the window."""


@dataclass(frozen=True)
class RunServices:
    """What every run of one dispatch process shares: the bus, the model side, other services' clients."""

    bus: Bus
    model_side: ModelSide
    memory: MemoryClient
    governance: GovernanceClient
    options: ExecutorOptions


@dataclass(frozen=True)
class AgentBinding:
    """One served agent: its spec, harness, tools and the instance its `@prompt` runs on."""

    spec: AgentSpec
    harness: AgentHarness
    tools: Mapping[str, ToolSpec]
    instance: Any
    mcp_tools: Mapping[str, str] = field(default_factory=dict)
    """Its MCP servers' tools among `tools`: model-facing name → the name governance sees (`docs.search`)."""


@dataclass(frozen=True)
class RunScope:
    """One run's fixed view: its request, its agent, the shared services, and what derives from them."""

    request: RunSubmission
    agent: AgentBinding
    services: RunServices
    workspace: WorkspaceScope | None
    """Where the run's plan and files live; None when it has no plan or file tools."""
    mode: PermissionMode
    """The run's permission mode: its agent's, or the stricter one its request asked for."""

    @classmethod
    def of(cls, request: RunSubmission, agent: AgentBinding, services: RunServices) -> RunScope:
        """The scope of `request` run as `agent`."""
        mode = run_mode(agent.spec.permission_mode, request)
        return cls(request, agent, services, workspace=_workspace(request, agent), mode=mode)

    @property
    def settings(self) -> ExecutorOptions:
        """The process's settings of every run."""
        return self.services.options

    @property
    def spec(self) -> AgentSpec:
        """The agent's declaration."""
        return self.agent.spec

    @property
    def model(self) -> str:
        """The model the agent asks for, or the runtime's ("" without either)."""
        return self.agent.spec.model or self.services.model_side.model

    @property
    def is_subagent(self) -> bool:
        """Whether this is the ephemeral sub-agent of `task` (its workspace goes with the run)."""
        return self.agent.spec.name == SUBAGENT


def _workspace(run: RunSubmission, agent: AgentBinding) -> WorkspaceScope | None:
    if agent.spec.name == SUBAGENT:
        return subagent_scope(run)
    harness = agent.harness
    if not harness.workspace_tools:
        return None
    # A run without a conversation (e.g. a bare gRPC call) has a workspace of its own.
    return harness.scope(agent.spec.name, run.conversation_id or run.session_id or run.run_id)
