"""The MCP servers of the MCP client's end-to-end suite, written with the `mcp` SDK.

`docs_server()` is served over streamable HTTP by the test (uvicorn); run as a script, this file is
the `files` server over stdio, which the sandbox service starts as its own child.
"""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations


def docs_server() -> MCPServer:
    """Searches and deletes pages (deleting is denied by the suite's policy)."""
    server = MCPServer("docs")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def search(query: str) -> str:
        """Search the documentation."""
        return f"2 pages mention {query}"

    @server.tool()
    def delete_page(title: str) -> str:
        """Delete a page."""
        return f"deleted {title}"

    return server


def files_server() -> MCPServer:
    """Reads files, and says which process it runs in."""
    server = MCPServer("files")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def read_file(path: str) -> str:
        """Read a file."""
        return f"contents of {path} (served by pid {os.getpid()}, child of {os.getppid()})"

    return server


if __name__ == "__main__":
    files_server().run("stdio")
