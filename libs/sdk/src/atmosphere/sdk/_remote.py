"""`RemoteAgent`: a coordinator's fleet member served elsewhere, reached over A2A.

Delegation never goes to a URL a model makes up: only the remote members an app declares in a
coordinator's `fleet` are reachable (the deployment may move one, `ATMOSPHERE_DELEGATION__REMOTES`,
never add one), and each call passes the same governance as a call to a local member.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from atmosphere.sdk.errors import UserError

AGENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-]{0,63}")
"""An agent's name: 1-64 letters, digits, '_' or '-', starting alphanumeric."""
MAX_URL_CHARS = 2048


@dataclass(frozen=True, slots=True)
class RemoteAgent:
    """A fleet member served by another A2A server: `delegate_task(agent=name)` sends it a message.

        @coordinator(name="lead", fleet=[Writer, RemoteAgent("researcher", "https://b.example/atmosphere/a2a/researcher")])

    `url` is the agent's A2A base URL, where its Agent Card is (`<url>/.well-known/agent-card.json`);
    empty when the deployment names it (`ATMOSPHERE_DELEGATION__REMOTES`, which also holds its
    bearer token, if it needs one). Its dispatch needs the `a2a` extra (`atmosphere-ai-dispatch[a2a]`).
    """

    name: str
    """How the coordinator's model names it (`delegate_task(agent=...)`), unique in its fleet."""
    url: str = ""
    """http(s) base URL of the agent's A2A interface (its Agent Card is under it)."""
    description: str = ""

    def __post_init__(self) -> None:
        """Refuse a name no agent can have, or a URL that is not plain http(s)."""
        if not AGENT_NAME.fullmatch(self.name):
            msg = f"remote agent name {self.name!r} must be 1-64 letters, digits, '_' or '-', starting alphanumeric"
            raise UserError(msg)
        problem = url_problem(self.url) if self.url else None
        if problem is not None:
            msg = f"remote agent {self.name!r}: {problem}"
            raise UserError(msg)


def url_problem(url: str) -> str | None:
    """Why `url` cannot be a remote agent's A2A URL, or None."""
    if len(url) > MAX_URL_CHARS:
        return f"its URL is longer than {MAX_URL_CHARS} characters"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError as exc:
        return f"its URL {url!r} is malformed ({exc})"
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        return f"its URL must be http:// or https:// with a host, got {url!r}"
    if parts.username or parts.password:
        return "its URL must not hold credentials (give a bearer token in ATMOSPHERE_DELEGATION__REMOTES)"
    if parts.query or parts.fragment:
        return f"its URL must have no query or fragment, got {url!r}"
    return None
