"""Token grants: the one definition of who may call, shared by every surface that authenticates.

Ingress (WebSocket, SSE, long-poll) and dispatch (gRPC) read the same variable,
`ATMOSPHERE_INGRESS__AUTH_TOKENS`, so a token means the same principal on every entry path.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

RESERVED_USER_IDS = frozenset({"anonymous"})
"""User ids a grant may not claim: "anonymous" marks runs and conversations that have no owner."""


class TokenGrant(BaseModel):
    """A bearer token or API key, the principal it stands for, and where it may be used."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    token: str = Field(min_length=8)
    """The secret the client sends (`Authorization: Bearer <token>` or `X-API-Key`)."""
    user_id: str = Field(min_length=1, max_length=256)
    """The principal's user id: it owns every run it starts and scopes its conversations."""
    name: str = ""
    """A display name or key label."""
    roles: tuple[str, ...] = ()
    """Roles granted to the principal."""
    tenant: str = Field(default="", max_length=256)
    """The tenant its usage is accounted to (governance's cost ceilings and drift); empty: the default."""
    paths: tuple[str, ...] = ("*",)
    """Agent paths it may use: exact paths, or prefixes ending in `*`."""

    @field_validator("user_id")
    @classmethod
    def _owning_user(cls, value: str) -> str:
        # A blank or reserved id would make the grant's runs ownerless, hence readable by anyone.
        if not value.strip() or value.strip().lower() in RESERVED_USER_IDS:
            reserved = " or ".join(sorted(RESERVED_USER_IDS))
            msg = f"must name a user (not blank, not {reserved})"
            raise ValueError(msg)
        return value.strip()

    def allows(self, path: str) -> bool:
        """Whether this grant may use the agent endpoint at `path`."""
        return any(path == p or (p.endswith("*") and path.startswith(p[:-1])) for p in self.paths)


class AuthOptions(BaseModel):
    """The token grants, read from `ATMOSPHERE_INGRESS__AUTH_TOKENS` by ingress and dispatch alike."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    auth_tokens: tuple[TokenGrant, ...] = ()
    """JSON list of token grants; when empty, agent endpoints and gRPC are anonymous."""
