"""The tool choke point of one run, set up from its scope: its tools, delegation, permissions, workspace."""

from __future__ import annotations

from atmosphere.dispatch.control import RunControl
from atmosphere.dispatch.delegation import Delegation
from atmosphere.dispatch.effects import RunEffects
from atmosphere.dispatch.run_scope import RunScope
from atmosphere.dispatch.tools import Emit, LocalTool, ToolGateway
from atmosphere.sdk import PermissionMode
from atmosphere.sdk.runtime import ToolSpec


def tool_gateway(
    scope: RunScope,
    emit: Emit,
    control: RunControl,
    effects: RunEffects | None,
    *,
    client_tools: tuple[ToolSpec, ...] = (),
) -> ToolGateway:
    """The gateway every tool call of `scope`'s run passes (and every call of the caller's own functions)."""
    agent, options = scope.agent, scope.settings
    harness = agent.harness
    return ToolGateway(
        bus=scope.services.bus,
        run=scope.request,
        emit=emit,
        # The model's tools, and the stores a native plan or file surface writes through.
        tools={**agent.tools, **harness.store_tools},
        mcp_tools=agent.mcp_tools,
        control=control,
        governance=scope.services.governance,
        approval_timeout=options.approval_timeout,
        workspace=scope.workspace,
        memory_tools=harness.workspace_tools,
        local_tools=_delegation_tools(scope, emit),
        offload_threshold=options.offload_threshold,
        offload=scope.workspace is not None and harness.has_files,
        effects=effects,
        permission_mode=scope.mode,
        permissions=options.tool_permissions,
        # Only the agent's own tools declare roles (a harness tool of the same name replaced it).
        tool_roles={t.name: t.roles for t in agent.spec.tools if t.roles and t.name not in harness.tools},
        client_tools={t.name: t for t in client_tools},
    )


def _delegation_tools(scope: RunScope, emit: Emit) -> dict[str, LocalTool]:
    """`delegate_task` and `task`, run in this process, when the agent's harness has them."""
    harness = scope.agent.harness
    if not harness.tools.keys() & {"delegate_task", "task"}:
        return {}
    mode, options = scope.mode, scope.services.options
    delegation = Delegation(
        scope.services.bus,
        scope.request,
        emit,
        fleet={member: options.agent_pools.get(member, "") for member in scope.spec.fleet},
        memory=scope.services.memory,
        # Only a stricter mode travels (PLAN, DENY_ALL): a looser one would be ignored anyway.
        permission_mode=mode.name if PermissionMode.DEFAULT.stricter(mode) is not PermissionMode.DEFAULT else "",
        remotes=options.remote_fleets.get(scope.spec.name, {}),
        governance=scope.services.governance,
        remote_limits=options.remote_limits,
    )
    local: dict[str, LocalTool] = {"delegate_task": delegation.delegate_task, "task": delegation.task}
    return {name: handler for name, handler in local.items() if name in harness.tools}
