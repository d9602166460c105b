"""`App`: the explicit list of agents a deployment serves, and loading it by reference."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, cast

from atmosphere.sdk._mcp import McpServer
from atmosphere.sdk._spec import AgentSpec, spec_of
from atmosphere.sdk._tool import Tool
from atmosphere.sdk.errors import UserError
from atmosphere.sdk.lifecycle import AgentLifecycleListener


class App:
    """The agents of one application, registered explicitly (no import-time globals)."""

    def __init__(
        self,
        agents: Iterable[type[Any]] = (),
        *,
        policies: Iterable[Any] = (),
        listeners: Iterable[AgentLifecycleListener] = (),
    ) -> None:
        """Register `agents` (each an `@agent` class; names must be unique) and governance `policies`.

        A policy is any object with an `identity`, `evaluate(context)` and `release(context)`
        (`atmosphere.governance.policies.BasePolicy` is the base to derive from); the governance
        service installs them after the policy files, in this order. `listeners` observe every
        model call of every agent (`atmosphere.sdk.lifecycle`), in dispatch.
        """
        given: tuple[object, ...] = tuple(listeners)  # checked: an app without mypy may pass anything
        for listener in given:
            if not isinstance(listener, AgentLifecycleListener):
                msg = f"{listener!r} is not an AgentLifecycleListener (atmosphere.sdk.lifecycle)"
                raise UserError(msg)
        self.listeners = cast("tuple[AgentLifecycleListener, ...]", given)
        self.policies: tuple[Any, ...] = tuple(policies)
        for policy in self.policies:
            if not (hasattr(policy, "identity") and callable(getattr(policy, "evaluate", None))):
                msg = f"{policy!r} is not a governance policy (it needs an identity and evaluate)"
                raise UserError(msg)
        self._agents: dict[str, AgentSpec] = {}
        self._tools: dict[str, Tool[Any, Any]] = {}
        paths: set[str] = set()
        for cls in agents:
            spec = spec_of(cls)
            if spec.name in self._agents:
                msg = f"two agents are named {spec.name!r}"
                raise UserError(msg)
            if spec.path in paths:
                msg = f"two agents are served at {spec.path!r}"
                raise UserError(msg)
            paths.add(spec.path)
            self._agents[spec.name] = spec
            for item in spec.tools:
                if self._tools.setdefault(item.name, item) is not item:
                    msg = f"two different tools are named {item.name!r}"
                    raise UserError(msg)
        self._mcp_servers = _mcp_servers(self._agents.values())
        for spec in self._agents.values():
            missing = [m for m in spec.fleet if m not in self._agents]
            if missing:
                msg = f"coordinator {spec.name!r} has fleet members that are not in the app: {missing}"
                raise UserError(msg)
            # A remote member's name is how the model reaches it: an agent of the app with the same
            # name could not be told apart from it.
            shadowing = [r.name for r in spec.remotes if r.name in self._agents]
            if shadowing:
                msg = f"coordinator {spec.name!r} has remote fleet members named like agents of the app: {shadowing}"
                raise UserError(msg)

    @property
    def agents(self) -> Mapping[str, AgentSpec]:
        """The agents by name, in registration order."""
        return dict(self._agents)

    def agent(self, name: str) -> AgentSpec | None:
        """The agent called `name`, or None."""
        return self._agents.get(name)

    @property
    def tools(self) -> Mapping[str, Tool[Any, Any]]:
        """Every tool of every agent, by name."""
        return dict(self._tools)

    @property
    def mcp_servers(self) -> Mapping[str, McpServer]:
        """Every MCP server any of its agents declares, by name (one name, one server)."""
        return dict(self._mcp_servers)

    @property
    def pools(self) -> tuple[str, ...]:
        """The runtime pools its agents are pinned to (`@agent(runtime=...)`), by name; not the default pool."""
        return tuple(sorted({spec.pool for spec in self._agents.values()} - {""}))

    def served_by(self, pool: str) -> App:
        """The part of this app one dispatch pool serves: the agents of `pool` ("" the default pool).

        A coordinator's fleet members may be served by other pools: they are not checked again here.
        """
        view = App.__new__(App)
        view.policies = self.policies
        view.listeners = self.listeners
        view._agents = {name: spec for name, spec in self._agents.items() if spec.pool == pool}
        view._tools = {t.name: t for spec in view._agents.values() for t in spec.tools}
        view._mcp_servers = _mcp_servers(view._agents.values())
        return view


def _mcp_servers(agents: Iterable[AgentSpec]) -> dict[str, McpServer]:
    """The MCP servers of `agents` by name; two agents may share a server only by declaring the same one."""
    servers: dict[str, McpServer] = {}
    for spec in agents:
        for server in spec.mcp_servers:
            if servers.setdefault(server.name, server) != server:
                msg = f"two different MCP servers are named {server.name!r}"
                raise UserError(msg)
    return servers


def load_app(reference: str, *, app_dir: str | Path | None = None) -> App:
    """Import `module:attribute` and return the `App` it names.

    `app_dir` (default: the current directory) is put first on `sys.path`, as uvicorn does,
    so `examples.echo:app` works from the project root.
    """
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        msg = f"ATMOSPHERE_APP must look like 'package.module:app', got {reference!r}"
        raise UserError(msg)
    directory = str(Path(app_dir or ".").resolve())
    if directory not in sys.path:
        sys.path.insert(0, directory)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        msg = f"cannot import {module_name!r} for ATMOSPHERE_APP={reference!r}: {exc}"
        raise UserError(msg) from exc
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        msg = f"{reference!r} is {type(app).__name__}, not an atmosphere.sdk.App"
        raise UserError(msg)
    return app
