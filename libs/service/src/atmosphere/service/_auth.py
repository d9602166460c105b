"""Who is calling and what they own: one definition for every surface that authenticates.

Ingress (HTTP and WebSocket) and dispatch (gRPC metadata) both turn a presented token into a
`Caller` here, so a token is the same principal on every entry path (mode parity). With no
grants configured every caller is anonymous and owns everything (the no-auth mode).

Ownership: the principal that started a run owns it (`RunEvent.owner` is its user id), and an
authenticated user's conversations are keyed under a digest of their user id
(`scoped_conversation`), so knowing another user's run or conversation id reaches nothing of
theirs.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass

from atmosphere.config import TokenGrant
from atmosphere.contracts.common.v1.common_pb2 import Principal

ANONYMOUS = Principal(auth_method="anonymous")

SCOPE_SEPARATOR = "--"
USER_KEY_CHARS = 16
_SCOPED = re.compile(rf"^([0-9a-f]{{{USER_KEY_CHARS}}}){SCOPE_SEPARATOR}")


class AuthError(Exception):
    """The caller may not use this surface; `status` is 401 (who are you?) or 403 (not this)."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(message)


def presented_token(headers: Mapping[str, str], query: Mapping[str, str]) -> tuple[str, str]:
    """The token the client sent and how: a bearer header, `X-API-Key`, or `access_token`.

    `headers` are looked up by lower-case name (HTTP headers and gRPC metadata both are). The
    query parameter exists for browsers' WebSocket API, which cannot set headers.
    """
    authorization = headers.get("authorization", "")
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip(), "bearer"
    if headers.get("x-api-key", "").strip():
        return headers["x-api-key"].strip(), "api-key"
    if query.get("access_token", "").strip():
        return query["access_token"].strip(), "bearer"
    return "", ""


ANONYMOUS_SCOPE = "anon"
"""The prefix an anonymous caller's scoped-looking conversation id gets (never a `user_key`)."""


def user_key(user_id: str) -> str:
    """A fixed-length digest of a user id: safe in any path or subject, and never colliding in practice."""
    return hashlib.sha256(user_id.encode()).hexdigest()[:USER_KEY_CHARS]


def scoped_conversation(conversation_id: str, principal: Principal) -> str:
    """`conversation_id` as the key of this principal's conversation.

    An authenticated user's id is prefixed with `user_key(user_id) + "--"`. Whatever id is given is
    scoped, an already scoped one included, so naming another user's scoped id yields a
    conversation of the caller's own.
    """
    user = principal.user_id.strip()
    if not user or user.lower() == "anonymous":
        if _SCOPED.match(conversation_id):
            # An anonymous caller must not pick a user's quota (or a fresh one per made-up
            # prefix): an id shaped like a scoped one stays in the anonymous bucket.
            return f"{ANONYMOUS_SCOPE}{SCOPE_SEPARATOR}{conversation_id}"
        return conversation_id
    return f"{user_key(user)}{SCOPE_SEPARATOR}{conversation_id}"


def conversation_user_key(conversation_id: str) -> str:
    """The `user_key` a scoped conversation id belongs to; "" for an unscoped (anonymous) one.

    Quotas and eviction count per this key, so one user's conversations never make room for
    another's.
    """
    match = _SCOPED.match(conversation_id)
    return match.group(1) if match else ""


@dataclass(frozen=True)
class Caller:
    """An identified caller: its principal and, when auth is on, the grant it presented."""

    principal: Principal
    grant: TokenGrant | None = None
    """None in no-auth mode: the caller may use every path and owns every run."""

    @property
    def user_id(self) -> str:
        """The caller's user id ("" when anonymous)."""
        return self.principal.user_id

    def may_use(self, path: str) -> bool:
        """Whether the caller may use the agent endpoint at `path`."""
        return self.grant is None or self.grant.allows(path)

    def owns(self, owner: str) -> bool:
        """Whether a run whose `RunEvent.owner` is `owner` belongs to this caller.

        With auth on, an ownerless run belongs to nobody: fail closed rather than open.
        """
        if self.grant is None:
            return True
        return bool(owner) and owner == self.principal.user_id

    def may_access(self, *, owner: str, path: str) -> bool:
        """Whether the caller may read, resume, cancel or answer a run of `owner` at agent `path`."""
        return self.may_use(path) and self.owns(owner)


@dataclass(frozen=True)
class Authenticator:
    """Maps a presented token to a caller (default-deny once grants are configured)."""

    grants: tuple[TokenGrant, ...]

    @property
    def enabled(self) -> bool:
        """Whether tokens are required at all."""
        return bool(self.grants)

    def identify(self, headers: Mapping[str, str], query: Mapping[str, str] | None = None) -> Caller:
        """Who is calling; `AuthError(401)` when tokens are configured and none valid was sent."""
        if not self.grants:
            return Caller(ANONYMOUS)
        token, method = presented_token(headers, query or {})
        if not token:
            raise AuthError(401, "Authentication required: send 'Authorization: Bearer <token>'")
        # Compare against every grant so timing does not reveal which one matched.
        matches = [g for g in self.grants if hmac.compare_digest(g.token.encode(), token.encode())]
        if not matches:
            raise AuthError(401, "Unknown token")
        grant = matches[0]
        principal = Principal(
            user_id=grant.user_id, name=grant.name, auth_method=method, roles=list(grant.roles), tenant=grant.tenant
        )
        return Caller(principal, grant)

    def caller(self, path: str, headers: Mapping[str, str], query: Mapping[str, str] | None = None) -> Caller:
        """The caller, checked against the agent `path`; `AuthError(403)` outside its grant."""
        caller = self.identify(headers, query)
        if not caller.may_use(path):
            raise AuthError(403, f"This token may not use {path}")
        return caller

    def principal(self, path: str, headers: Mapping[str, str], query: Mapping[str, str] | None = None) -> Principal:
        """The caller's principal for the agent `path` (`AuthError` with 401 or 403 otherwise)."""
        return self.caller(path, headers, query).principal
