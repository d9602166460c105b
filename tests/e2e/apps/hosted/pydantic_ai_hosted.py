"""A PydanticAI `Agent` naming no model: the platform's configured one runs it."""

from __future__ import annotations

import pydantic_ai

from tests.e2e.apps.adapters_app import native_forbidden_text, native_lookup_text, native_transfer_text

hosted: pydantic_ai.Agent[None, str] = pydantic_ai.Agent(instructions="You answer briefly.", name="pydantic")
hosted.tool_plain(name="native_lookup")(native_lookup_text)
hosted.tool_plain(name="native_forbidden")(native_forbidden_text)
hosted.tool_plain(name="native_transfer")(native_transfer_text)
