"""Who may run a tool, and whether someone must approve it first: modes, configured permissions, roles.

The choke point (`tools.ToolGateway`) asks three questions, in Atmosphere's order (§11.3):

1. before `tool-start`: does the caller hold every role the tool requires (`missing_roles`)?
2. after it: does the run's `PermissionMode` or the operator's configured permission
   (`ATMOSPHERE_TOOLS__PERMISSIONS`) refuse the call, and
3. if not, must a human approve it first (`ToolGate.needs_approval`)?

A run's mode is its agent's (`@agent(permission_mode=...)`) unless the request asks for a
stricter one (`run_mode`): a client may tighten the gates on its own run, never lift them.
"""

from __future__ import annotations

import enum
import fnmatch
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from atmosphere.contracts.run.v1.run_pb2 import RunSubmission
from atmosphere.dispatch.tool_errors import denied_by_configuration, denied_by_mode
from atmosphere.sdk import PermissionMode, ToolKind
from atmosphere.sdk.runtime import ToolSpec

log = logging.getLogger("atmosphere.dispatch")

MODE_METADATA_KEYS = ("ai.permissionMode", "hints.permissionMode")
"""Where a request names its mode: run metadata (gRPC, sub-runs), or a client's `hints` (WebSocket, SSE)."""


class ToolPermission(enum.StrEnum):
    """What the operator's configuration says of a tool (`atmosphere.tools.permissions.<tool>`)."""

    DENY = "deny"
    """Never run it, in any mode."""
    CONFIRM = "confirm"
    """Run it only once a human approved the call (as if it declared `requires_approval`)."""


@dataclass(frozen=True)
class ToolPermissions:
    """The configured permissions by tool name or `fnmatch` glob (`delete_*`).

    A tool's exact name wins over any glob; among matching globs, `deny` wins over `confirm`
    (the configuration never becomes more permissive by the order of its keys).
    """

    rules: Mapping[str, ToolPermission] = field(default_factory=dict)

    def of(self, tool: str) -> ToolPermission | None:
        """The permission configured for `tool`, or None."""
        exact = self.rules.get(tool)
        if exact is not None:
            return exact
        matched = {permission for pattern, permission in self.rules.items() if fnmatch.fnmatchcase(tool, pattern)}
        if ToolPermission.DENY in matched:
            return ToolPermission.DENY
        return ToolPermission.CONFIRM if matched else None


@dataclass(frozen=True)
class ToolGate:
    """The verdict on one call after `tool-start`: refused (with the model's text), or run (maybe approved first)."""

    refusal: str | None = None
    needs_approval: bool = False


def gate(mode: PermissionMode, permission: ToolPermission | None, spec: ToolSpec) -> ToolGate:
    """What `mode` and the configured `permission` make of a call to `spec`.

    DENY_ALL refuses everything; a configured `deny` refuses in every other mode (BYPASS
    included). Then approval: PLAN asks for every call, BYPASS for none, ACCEPT_EDITS for none
    of kind EDIT; otherwise a call asks when its tool declares `requires_approval` or is
    configured `confirm`.
    """
    if mode is PermissionMode.DENY_ALL:
        return ToolGate(refusal=denied_by_mode(spec.name))
    if permission is ToolPermission.DENY:
        return ToolGate(refusal=denied_by_configuration(spec.name))
    if mode is PermissionMode.PLAN:
        return ToolGate(needs_approval=True)
    if auto_approves(mode, spec):
        return ToolGate()
    return ToolGate(needs_approval=spec.requires_approval or permission is ToolPermission.CONFIRM)


def auto_approves(mode: PermissionMode, spec: ToolSpec) -> bool:
    """Whether `mode` lets a call to `spec` run without asking anyone (also when the tool itself asks)."""
    return mode is PermissionMode.BYPASS or (mode is PermissionMode.ACCEPT_EDITS and spec.kind is ToolKind.EDIT)


def missing_roles(required: Iterable[str], held: Iterable[str]) -> list[str]:
    """The roles of `required` that `held` lacks (exact names), in their declared order."""
    holding = set(held)
    return [role for role in required if role not in holding]


def requested_mode(run: RunSubmission) -> PermissionMode | None:
    """The mode the request names, or None (absent, or not a mode's name: logged)."""
    for key in MODE_METADATA_KEYS:
        raw = run.metadata.get(key)
        if raw is None:
            continue
        text = raw
        try:
            decoded = json.loads(raw)  # a client's hints arrive JSON-encoded ("\"plan\"")
        except (ValueError, RecursionError):
            decoded = None
        if isinstance(decoded, str):
            text = decoded
        mode = PermissionMode.parse(text)
        if mode is None:
            log.warning("run %s: ignoring %s=%r: not a permission mode", run.run_id, key, raw[:64])
        return mode
    return None


def run_mode(agent_mode: PermissionMode, run: RunSubmission) -> PermissionMode:
    """The mode `run` executes under: its agent's, or the request's when that is stricter.

    A looser request (e.g. `bypass` for a DEFAULT agent) is ignored and logged: approvals
    protect the world from what the client's model does, so the client cannot switch them off.
    """
    requested = requested_mode(run)
    if requested is None:
        return agent_mode
    mode = agent_mode.stricter(requested)
    if mode is not requested:
        log.warning(
            "run %s: ignoring the requested permission mode %s: it is looser than the agent's %s",
            run.run_id,
            requested.name,
            agent_mode.name,
        )
    return mode
