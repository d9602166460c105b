"""What hosts share: the services (and runtime adapters) that load, describe and run agents.

Users write agents with `atmosphere.sdk`; nothing here is needed for that. This surface is for
the platform's own services and for third-party hosts: the record a declaration leaves
(`AgentSpec`, `spec_of`), loading an app by reference (`load_app`), the `SessionHost` a
`StreamingSession` fronts (the host's run), argument validation errors, and how a tool's
`ToolSignal` becomes its call's outcome. The model-runtime SPI is `atmosphere.sdk.runtime`; the
harness's built-in tool schemas and compaction are `atmosphere.sdk.builtin_tools` and
`atmosphere.sdk.compaction`.
"""

from atmosphere.sdk._app import load_app
from atmosphere.sdk._capability import AiCapability
from atmosphere.sdk._harness import HarnessSwitch
from atmosphere.sdk._mcp import MCP_SEPARATOR, mcp_governed_name, mcp_server_of, mcp_tool_name
from atmosphere.sdk._policies import BudgetReason
from atmosphere.sdk._session import EventSink, SessionHost
from atmosphere.sdk._spec import AgentSpec, spec_of
from atmosphere.sdk._tool import APPROVED_ARGUMENT, DEFAULT_TOOL_TIMEOUT, ToolArgumentsError, render_result
from atmosphere.sdk.errors import RETRY_SUFFIX, ToolSignal

__all__ = [
    "APPROVED_ARGUMENT",
    "DEFAULT_TOOL_TIMEOUT",
    "MCP_SEPARATOR",
    "RETRY_SUFFIX",
    "AgentSpec",
    "AiCapability",
    "BudgetReason",
    "EventSink",
    "HarnessSwitch",
    "SessionHost",
    "ToolArgumentsError",
    "ToolSignal",
    "load_app",
    "mcp_governed_name",
    "mcp_server_of",
    "mcp_tool_name",
    "render_result",
    "spec_of",
]
