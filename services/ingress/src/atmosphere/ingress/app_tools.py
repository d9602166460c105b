"""The app's `@tool`s a door exposes to be called directly (`ATMOSPHERE_MCP__TOOLS`), and their names.

An exposed tool is offered once per agent that has it as its own (`AgentDescriptor.app_tools`,
runtime truth from the dispatch serving the agent) and whose tool a sandbox serves (its
`ATMO_TOOLS` descriptor: the description and JSON schema). Its name is `<agent>__<tool>`:
letters, digits, `_` and `-` only, which every MCP client and every model API takes (a dot, which
MCP allows, is refused by model APIs that check function names). Agent and tool names never
contain a dot but may contain `__`, so a name that two pairs would share, or that is an agent's own
name (an agent is a tool of the door too), or that is no valid tool name, is not offered at all:
an agent always wins, and a name never means two things.

Who sees which: only the tools of agents the caller may use (token grants, `Caller.may_use`), the
same rule as for the agents; a call is a run of that agent for the caller (`direct_call` in
dispatch), so its owner, admission, governance, approvals and tape are every run's.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from atmosphere.bus import Bus, BusError, subjects
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.tool.v1.tool_pb2 import ToolDescriptor
from atmosphere.ingress.auth import Caller

log = logging.getLogger("atmosphere.ingress")

SEPARATOR = "__"
"""Between the agent's name and the tool's in an exposed tool's name."""
EXPOSED_NAME = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
"""What an exposed tool's name may be: MCP's tool names (SEP-986) without the dot."""
EVERY_TOOL = "*"


@dataclass(frozen=True, slots=True)
class AppTool:
    """One exposed tool: the agent whose run calls it, and what it is."""

    name: str
    """Its name on the door: `<agent>__<tool>`."""
    agent: AgentDescriptor
    tool: str
    descriptor: ToolDescriptor

    @property
    def input_schema(self) -> dict[str, Any]:
        """The JSON schema of its arguments object (as the sandbox published it)."""
        schema = json.loads(self.descriptor.parameters_json_schema or "{}")
        return schema if isinstance(schema, dict) and schema.get("type") == "object" else {"type": "object"}


def exposed_name(agent: str, tool: str) -> str:
    """The name `agent`'s `tool` has on the door."""
    return f"{agent}{SEPARATOR}{tool}"


def app_tools(
    agents: Iterable[AgentDescriptor], descriptors: Mapping[str, ToolDescriptor], exposed: Iterable[str]
) -> dict[str, AppTool]:
    """Every tool exposed by the setting `exposed`, by its name on the door (for any caller).

    A name two pairs would share, an agent's name, or an invalid one is offered by nobody.
    """
    chosen = frozenset(exposed)
    if not chosen:
        return {}
    agents = list(agents)
    taken = {agent.name for agent in agents}
    found: dict[str, AppTool] = {}
    shared: set[str] = set()
    for agent in agents:
        for tool in agent.app_tools:
            descriptor = descriptors.get(tool)
            if (EVERY_TOOL not in chosen and tool not in chosen) or descriptor is None:
                continue
            if descriptor.provider != "sandbox":
                continue
            name = exposed_name(agent.name, tool)
            if name in taken or not EXPOSED_NAME.fullmatch(name):
                log.debug("the tool %s of agent %s is not exposed: its name %r is unusable", tool, agent.name, name)
                continue
            if name in found:
                shared.add(name)
            found[name] = AppTool(name, agent, tool, descriptor)
    for name in shared:
        log.warning("the exposed tool name %r would mean two tools; neither is offered", name)
        del found[name]
    return found


def usable_by(caller: Caller, tools: Mapping[str, AppTool]) -> dict[str, AppTool]:
    """The tools of `tools` whose agent `caller` may use."""
    return {name: tool for name, tool in tools.items() if caller.may_use(tool.agent.path)}


class ToolDescriptors:
    """The `ATMO_TOOLS` descriptors the sandboxes publish, read at most every `ttl` seconds."""

    def __init__(self, bus: Bus, *, ttl: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        """Read from `bus`, keeping what was read for `ttl` seconds (`clock`: monotonic seconds)."""
        self._bus = bus
        self._ttl = ttl
        self._clock = clock
        self._read_at: float | None = None
        self._items: dict[str, ToolDescriptor] = {}

    async def all(self) -> Mapping[str, ToolDescriptor]:
        """Every published descriptor by tool name (a `BusError` only when the bucket was never read)."""
        now = self._clock()
        if self._read_at is not None and now - self._read_at < self._ttl:
            return self._items
        try:
            self._items = await self._bus.kv_items(subjects.TOOLS_BUCKET, ToolDescriptor)
        except BusError:
            if self._read_at is None:
                raise
            # What was read before still describes the tools: better than refusing everyone.
            log.warning("the tool descriptors could not be re-read; using the last copy")
            return self._items
        self._read_at = now
        return self._items
