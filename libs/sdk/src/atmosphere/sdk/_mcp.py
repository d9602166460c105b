"""`McpServer`: an MCP server whose tools an agent may call, and how those tools are named.

An agent declares its servers (`@agent(mcp_servers=[McpServer.http(...), McpServer.stdio(...)])`);
the sandbox service connects to them (a streamable HTTP session, or a child process of its own
speaking stdio), lists their tools while they answer and runs the calls; dispatch offers the tools
to the model and passes every call through its choke point, like any other tool.

Each tool has two names. The model calls it `<server>__<tool>` (a model-facing function name is
`^[a-zA-Z0-9_-]{1,64}$`); governance, the operator's permissions and the logs see
`<server>.<tool>` (a policy denies `call_tool:docs.search`). A server's name is an identifier
without a double underscore, so the first `__` of a model-facing name always ends the server's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import urlsplit

from atmosphere.sdk._tool import DEFAULT_TOOL_TIMEOUT
from atmosphere.sdk.errors import UserError

McpTransport = Literal["http", "stdio"]

MCP_SEPARATOR: Final = "__"
"""Between a server's name and its tool's in the model-facing name."""
MAX_TIMEOUT: Final = 3600.0
_SERVER_NAME: Final = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)*")
_MAX_SERVER_NAME: Final = 32
_MODEL_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class McpServer:
    """An MCP server an agent's model may call tools of (build one with `http` or `stdio`).

    Its URL, command and environment may hold secrets: they are never logged or reported, and
    its `repr` shows only `describe()`.
    """

    name: str
    """An identifier (letters, digits, single underscores; at most 32): `docs`, `file_store`."""
    transport: McpTransport
    url: str = ""
    """`http`: the server's streamable HTTP endpoint (`https://host/mcp`)."""
    command: tuple[str, ...] = ()
    """`stdio`: the program and its arguments, started by the sandbox service as its child."""
    env: tuple[tuple[str, str], ...] = ()
    """`stdio`: variables added to the child's environment (a minimal one, not the sandbox's own)."""
    cwd: str | None = None
    """`stdio`: the child's working directory (None: the sandbox's)."""
    timeout: float = DEFAULT_TOOL_TIMEOUT
    """Seconds one call of any of its tools may take before it is an error for the model."""

    @classmethod
    def http(cls, name: str, url: str, *, timeout: float = DEFAULT_TOOL_TIMEOUT) -> McpServer:
        """A server reached over streamable HTTP at `url` (`http://` or `https://`)."""
        parts = urlsplit(url)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            msg = f"MCP server {name!r}: the URL must be http:// or https:// with a host"
            raise UserError(msg)
        return cls(name=_checked_name(name), transport="http", url=url, timeout=_checked_timeout(name, timeout))

    @classmethod
    def stdio(
        cls,
        name: str,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float = DEFAULT_TOOL_TIMEOUT,
    ) -> McpServer:
        """A server the sandbox service starts as its child (`command`: program, then arguments), over stdio."""
        if isinstance(command, str) or not command or not all(isinstance(part, str) and part for part in command):
            msg = f"MCP server {name!r}: the command must be a non-empty list of strings, e.g. ['python', '-m', 'x']"
            raise UserError(msg)
        variables = dict(env or {})
        bad = [key for key in variables if not _ENV_NAME.fullmatch(key) or not isinstance(variables[key], str)]
        if bad:
            msg = f"MCP server {name!r}: environment variables need identifier names and string values: {bad}"
            raise UserError(msg)
        return cls(
            name=_checked_name(name),
            transport="stdio",
            command=tuple(command),
            env=tuple(sorted(variables.items())),
            cwd=cwd,
            timeout=_checked_timeout(name, timeout),
        )

    def describe(self) -> str:
        """Where it is, without secrets: `http://host:port/path` (no credentials, no query) or the program."""
        if self.transport == "http":
            parts = urlsplit(self.url)
            port = f":{parts.port}" if parts.port else ""
            return f"{parts.scheme}://{parts.hostname}{port}{parts.path}"
        return f"stdio:{self.command[0].rsplit('/', 1)[-1]}"

    def __repr__(self) -> str:
        """Name, transport and `describe()` only."""
        return f"McpServer(name={self.name!r}, {self.describe()})"


def _checked_name(name: str) -> str:
    if not isinstance(name, str) or len(name) > _MAX_SERVER_NAME or not _SERVER_NAME.fullmatch(name):
        msg = (
            f"MCP server name {name!r} must be an identifier of at most {_MAX_SERVER_NAME} characters: "
            "letters and digits, single underscores between them (e.g. 'docs', 'file_store')"
        )
        raise UserError(msg)
    return name


def _checked_timeout(name: str, timeout: float) -> float:
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT):
        msg = f"MCP server {name!r}: timeout must be > 0 and <= {MAX_TIMEOUT:g} seconds"
        raise UserError(msg)
    return float(timeout)


def mcp_tool_name(server: str, tool: str) -> str | None:
    """The model-facing name of `server`'s `tool` (`docs__search`), or None when none fits.

    A tool whose name would not make a valid function name for the model (a dot, a slash, too
    long) is not offered: there is no name the model could call it by.
    """
    name = f"{server}{MCP_SEPARATOR}{tool}"
    return name if _MODEL_NAME.fullmatch(name) else None


def mcp_governed_name(model_name: str) -> str:
    """The name governance and permissions see for a model-facing MCP tool name: `docs.search`."""
    server, _, tool = model_name.partition(MCP_SEPARATOR)
    return f"{server}.{tool}" if tool else model_name


def mcp_server_of(model_name: str) -> str:
    """The server part of a model-facing MCP tool name (`docs` of `docs__search`)."""
    return model_name.partition(MCP_SEPARATOR)[0]


def mcp_servers_by_name(servers: Sequence[object], owner: str) -> tuple[McpServer, ...]:
    """`servers` checked: each an `McpServer`, no two of one name."""
    checked: list[McpServer] = []
    for server in servers:
        if not isinstance(server, McpServer):
            msg = f"{owner}: mcp_servers must be McpServer.http(...) or McpServer.stdio(...), got {type(server)!r}"
            raise UserError(msg)
        checked.append(server)
    names = [s.name for s in checked]
    if len(set(names)) != len(names):
        msg = f"{owner}: two MCP servers share a name in {names}"
        raise UserError(msg)
    return tuple(checked)
