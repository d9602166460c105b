"""Who is calling: token grants for agent endpoints, and the admin token gate."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.ingress.settings import TokenGrant

ANONYMOUS = Principal(auth_method="anonymous")


class AuthError(Exception):
    """The caller may not use this surface; `status` is 401 or 403."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(message)


def presented_token(headers: Mapping[str, str], query: Mapping[str, str]) -> tuple[str, str]:
    """The token the client sent and how: a bearer header, `X-API-Key`, or `access_token`.

    The query parameter exists for browsers' WebSocket API, which cannot set headers.
    """
    authorization = headers.get("authorization", "")
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip(), "bearer"
    if headers.get("x-api-key"):
        return headers["x-api-key"].strip(), "api-key"
    if query.get("access_token"):
        return query["access_token"].strip(), "bearer"
    return "", ""


def _allows(grant: TokenGrant, path: str) -> bool:
    return any(path == p or (p.endswith("*") and path.startswith(p[:-1])) for p in grant.paths)


@dataclass(frozen=True)
class Authenticator:
    """Maps a presented token to a principal for an agent path (default-deny once configured)."""

    grants: tuple[TokenGrant, ...]

    def principal(self, path: str, headers: Mapping[str, str], query: Mapping[str, str]) -> Principal:
        """The caller's principal; `AuthError` when tokens are configured and this one does not fit."""
        if not self.grants:
            return ANONYMOUS
        token, method = presented_token(headers, query)
        if not token:
            raise AuthError(401, "Authentication required: send 'Authorization: Bearer <token>'")
        # Compare against every grant so timing does not reveal which prefix matched.
        matches = [g for g in self.grants if hmac.compare_digest(g.token.encode(), token.encode())]
        if not matches:
            raise AuthError(401, "Unknown token")
        grant = matches[0]
        if not _allows(grant, path):
            raise AuthError(403, f"This token may not use {path}")
        return Principal(user_id=grant.user_id, name=grant.name, auth_method=method, roles=list(grant.roles))


@dataclass(frozen=True)
class AdminGate:
    """The `/api/admin/*` gate: the admin token when reads require authentication."""

    required: bool
    token: str

    def check(self, headers: Mapping[str, str]) -> None:
        """Pass, or raise `AuthError` (403 when no admin token is configured: fail-closed)."""
        if not self.required:
            return
        if not self.token:
            raise AuthError(
                403,
                "Admin reads are disabled: set ATMOSPHERE_ADMIN_TOKEN (or turn off "
                "ATMOSPHERE_ADMIN_HTTP_READ_AUTH_REQUIRED)",
            )
        presented, _ = presented_token(headers, {})
        if not presented or not hmac.compare_digest(presented.encode(), self.token.encode()):
            raise AuthError(401, "Admin reads need 'Authorization: Bearer <admin token>'")
