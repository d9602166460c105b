"""The sandbox's own tools (`code_exec`, `eval`), and MCP servers' tools, as the sandboxes offer them now.

Unlike the app's `@tool` functions, these are not declared by the agent: the sandbox publishes
their descriptors to `ATMO_TOOLS` only when their backend is enabled *and* confirmed to isolate at
runtime (`ATMOSPHERE_AI_CODE_ENABLED` + bubblewrap or a container engine; `ATMOSPHERE_AI_EVAL_ENABLED`
+ a V8 worker that started), and deletes them at start when it cannot offer them. Dispatch reads
the bucket at most every `refresh` seconds, so a sandbox restarted with the tool switched off takes
it away from new runs within that time. An agent's own tool of the same name wins.

The tools of the MCP servers an app declares are there too (provider `mcp`, named
`<server>__<tool>`): a sandbox lists each server while it answers and deletes its tools when it
stops (`atmosphere.sandbox.mcp_client`). An agent is offered those of the servers it declares
(`mcp_tools_of`); governance sees each as `<server>.<tool>`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Final

from atmosphere.bus import Bus, BusError, subjects
from atmosphere.contracts.tool.v1.tool_pb2 import ToolDescriptor
from atmosphere.sdk import ToolKind, ToolLoopPolicy
from atmosphere.sdk.host import DEFAULT_TOOL_TIMEOUT, AgentSpec, mcp_server_of
from atmosphere.sdk.runtime import ToolSpec

log = logging.getLogger("atmosphere.dispatch")

SANDBOX_BUILTIN_TOOLS: Final = ("code_exec", "eval")
MCP_PROVIDER: Final = "mcp"
"""The provider of an MCP server's tool in `ATMO_TOOLS` (listed by a sandbox while the server answers)."""
"""The tools a sandbox offers of its own accord (not from the app)."""
CODE_EXEC_TOOL_LOOP_CAP: Final = 25
"""The tool-loop cap of a run offered `code_exec` (the original's rule: writing and running code takes rounds)."""

_KINDS: Final = {kind.to_proto(): kind for kind in ToolKind}


def tool_spec_from_descriptor(descriptor: ToolDescriptor) -> ToolSpec:
    """The runtime spec of a published descriptor."""
    return ToolSpec(
        name=descriptor.name,
        description=descriptor.description,
        parameters=json.loads(descriptor.parameters_json_schema or '{"type": "object"}'),
        kind=_KINDS.get(descriptor.kind, ToolKind.OTHER),
        timeout=descriptor.timeout_seconds or DEFAULT_TOOL_TIMEOUT,
        idempotent=descriptor.idempotent,
    )


class SandboxTools:
    """What the sandboxes offer now, read from `ATMO_TOOLS` and kept for `refresh` seconds."""

    def __init__(self, bus: Bus, *, refresh: float = 5.0) -> None:
        """Read the offers over `bus`, again once `refresh` seconds have passed since the last read."""
        self._bus = bus
        self._refresh = refresh
        self._offered: dict[str, ToolSpec] = {}
        self._mcp: dict[str, ToolSpec] = {}
        self._read_at: float | None = None
        self._failing = False

    async def offered(self) -> Mapping[str, ToolSpec]:
        """The sandbox's own tools on offer (the last answer when the bucket cannot be read now)."""
        await self._read()
        return self._offered

    async def mcp_offered(self) -> Mapping[str, ToolSpec]:
        """The MCP servers' tools listed now, by model-facing name (`<server>__<tool>`)."""
        await self._read()
        return self._mcp

    async def _read(self) -> None:
        now = time.monotonic()
        if self._read_at is not None and now - self._read_at < self._refresh:
            return
        offered: dict[str, ToolSpec] = {}
        mcp: dict[str, ToolSpec] = {}
        try:
            for name, descriptor in (await self._bus.kv_items(subjects.TOOLS_BUCKET, ToolDescriptor)).items():
                if name in SANDBOX_BUILTIN_TOOLS and descriptor.provider == "sandbox":
                    offered[name] = tool_spec_from_descriptor(descriptor)
                elif descriptor.provider == MCP_PROVIDER and descriptor.name == name:
                    mcp[name] = tool_spec_from_descriptor(descriptor)
        except (BusError, ValueError) as exc:
            if not self._failing:  # once per outage, not once per run
                log.warning("the sandbox's tools could not be read (%s); keeping the last known offer", exc)
            self._failing = True
            return
        self._offered, self._mcp, self._read_at, self._failing = offered, mcp, now, False


def mcp_tools_of(spec: AgentSpec, listed: Mapping[str, ToolSpec]) -> dict[str, ToolSpec]:
    """The listed MCP tools of the servers `spec` declares."""
    declared = {server.name for server in spec.mcp_servers}
    return {name: tool for name, tool in listed.items() if mcp_server_of(name) in declared}


def with_sandbox_tools(tools: Mapping[str, ToolSpec], offered: Mapping[str, ToolSpec]) -> dict[str, ToolSpec]:
    """An agent's tools plus the sandbox's offer (the agent's own tool of the same name wins)."""
    return {**offered, **tools}


def tool_loop_for(policy: ToolLoopPolicy, tools: Mapping[str, ToolSpec]) -> ToolLoopPolicy:
    """`policy`, with its cap raised to 25 when the run may run code (`code_exec`)."""
    if "code_exec" in tools and policy.cap < CODE_EXEC_TOOL_LOOP_CAP:
        return replace(policy, cap=CODE_EXEC_TOOL_LOOP_CAP)
    return policy
