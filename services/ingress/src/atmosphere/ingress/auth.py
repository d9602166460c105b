"""Who is calling: token grants for agent endpoints (shared with gRPC), and the admin token gate.

Grants, callers and ownership are defined once in `atmosphere.service` (dispatch's gRPC uses the
same ones); they are re-exported here for ingress's routes.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from atmosphere.service import ANONYMOUS, Authenticator, AuthError, Caller, presented_token

__all__ = ["ANONYMOUS", "AdminGate", "AuthError", "Authenticator", "Caller", "presented_token"]


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
