"""A tiny MCP server over stdio (the `mcp` SDK's `MCPServer`), started by the sandbox as its child.

Run as `python stdio_server.py`; its tools say which process runs them and can end it.
"""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

server = MCPServer("files")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def read_file(path: str) -> str:
    """Read a file of the store."""
    return f"{os.environ.get('FILES_PREFIX', '')}contents of {path}"


@server.tool()
def parent_pid() -> str:
    """The process that started this server."""
    return str(os.getppid())


@server.tool()
def crash() -> str:
    """End the server's process at once (its session is lost)."""
    os._exit(3)


if __name__ == "__main__":
    server.run("stdio")
