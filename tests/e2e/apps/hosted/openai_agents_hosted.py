"""An Agents SDK `Agent` naming no model: the platform's configured one runs it."""

from __future__ import annotations

import agents

from tests.e2e.apps.adapters_app import native_forbidden_text, native_lookup_text, native_transfer_text

hosted = agents.Agent(
    name="openai-agents",
    instructions="You answer briefly.",
    tools=[
        agents.function_tool(native_lookup_text, name_override="native_lookup"),
        agents.function_tool(native_forbidden_text, name_override="native_forbidden"),
        agents.function_tool(native_transfer_text, name_override="native_transfer"),
    ],
)
