"""`PermissionMode`: how freely an agent's tool calls run, from "ask for everything" to "ask for nothing"."""

from __future__ import annotations

import enum


class PermissionMode(enum.StrEnum):
    """How an agent's tool calls are gated (Atmosphere's `PermissionMode`).

    An agent declares one (`@agent(permission_mode=...)`, default `DEFAULT`); a request may only
    make it stricter (see `stricter`). Whatever the mode, a tool the operator's configuration
    denies (`ATMOSPHERE_TOOLS__PERMISSIONS`) stays denied.
    """

    DEFAULT = "default"
    """Each tool asks for approval as it declares (`requires_approval`) or as configured (`confirm`)."""
    PLAN = "plan"
    """Every tool call needs approval: the user sees the plan unfold one step at a time."""
    ACCEPT_EDITS = "accept_edits"
    """Tools of kind EDIT run without approval even when they ask for it; others as in DEFAULT."""
    BYPASS = "bypass"
    """Every tool runs without approval (configured denials still apply)."""
    DENY_ALL = "deny_all"
    """No tool runs at all."""

    @property
    def strictness(self) -> int:
        """Higher is stricter: DENY_ALL > PLAN > DEFAULT > ACCEPT_EDITS > BYPASS."""
        return _STRICTNESS[self]

    def stricter(self, requested: PermissionMode) -> PermissionMode:
        """`requested` if it is at least as strict as this mode, else this mode.

        A request may tighten its agent's mode, never loosen it: the client is the party the
        approvals protect against, so it must not be able to lift them itself.
        """
        return requested if requested.strictness >= self.strictness else self

    @staticmethod
    def parse(text: str) -> PermissionMode | None:
        """A mode by name, in any case and with `-` or `_` (`plan`, `DENY_ALL`, `accept-edits`); None if unknown."""
        name = text.strip().lower().replace("-", "_")
        name = name.removeprefix("permissionmode.")
        try:
            return PermissionMode(name)
        except ValueError:
            return None


_STRICTNESS = {
    PermissionMode.BYPASS: 0,
    PermissionMode.ACCEPT_EDITS: 1,
    PermissionMode.DEFAULT: 2,
    PermissionMode.PLAN: 3,
    PermissionMode.DENY_ALL: 4,
}
