"""The app of the MCP client's end-to-end suite: an agent calling the tools of two MCP servers.

ATMOSPHERE_APP=tests.e2e.apps.mcp_app:app, with `MCP_APP_DOCS_URL` naming the streamable HTTP
server the test serves; the `files` server is `mcp_servers.py`, started over stdio by the sandbox.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from atmosphere.sdk import App, McpServer, agent

DOCS_URL_ENV = "MCP_APP_DOCS_URL"

DOCS = McpServer.http("docs", os.environ.get(DOCS_URL_ENV, "http://127.0.0.1:9/mcp"), timeout=30)
FILES = McpServer.stdio("files", [sys.executable, str(Path(__file__).with_name("mcp_servers.py"))], timeout=30)


@agent(
    name="librarian",
    description="Answers from the docs and the file store.",
    system_prompt="Use your tools.",
    mcp_servers=[DOCS, FILES],
    harness=[],
)
class Librarian:
    """A model agent whose tools are all MCP servers' tools."""


app = App(agents=[Librarian])
