"""The MCP client: the tools of the MCP servers an app's agents declare, listed and called from the sandbox.

Only the sandbox talks to MCP servers (streamable HTTP sessions, and stdio servers run as its own
children, never in dispatch); dispatch sees their tools as descriptors in `ATMO_TOOLS` and sends
each call, once its choke point passed it, to `atmo.tool.mcp:<server>`. The SDK (`mcp`) is the
sandbox's `mcp` extra: this package imports it, so `app.py` imports this package only when the
app declares a server.
"""
