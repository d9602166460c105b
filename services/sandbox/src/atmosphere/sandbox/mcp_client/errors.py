"""The texts the model reads when a call of an MCP server's tool does not give it the tool's result.

Each names the server (and the tool as governance knows it, `<server>.<tool>`), never its URL or
command, which may hold secrets.
"""

from __future__ import annotations


def server_unavailable(server: str, tool: str, why: str) -> str:
    """The server did not answer: not reachable, not started, its session lost."""
    return f"Error: the MCP server '{server}' is not answering ({why}); {tool} did not run. Try again later."


def timed_out(server: str, tool: str, timeout: float) -> str:
    """The server took longer than its timeout."""
    return f"Error: the MCP server '{server}' did not finish {tool} within {timeout:g}s"


def server_refused(server: str, tool: str, message: str) -> str:
    """The server answered the call with a protocol error (an unknown tool, bad arguments)."""
    return f"Error: the MCP server '{server}' refused {tool}: {message}"


def tool_failed(tool: str, text: str) -> str:
    """The tool ran and reported a failure (`isError`): its own words."""
    return text if text.startswith("Error: ") else f"Error: {tool} failed: {text or 'no details given'}"


def not_its_tool(server: str, name: str) -> str:
    """A call that reached the server's subject naming a tool of another."""
    return f"Error: {name} is not a tool of the MCP server '{server}'"


def sdk_missing() -> str:
    """The info's state of a server when the sandbox has no MCP SDK (its `mcp` extra)."""
    return "INACTIVE(no MCP client here: the sandbox's mcp extra is not installed)"
