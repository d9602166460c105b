"""`AiCapability`: what a runtime can do, declared only when a contract test proves it."""

from __future__ import annotations

from enum import Enum


class AiCapability(Enum):
    """Atmosphere's capability flags (runtime truth: a flag is a tested claim)."""

    TEXT_STREAMING = "TEXT_STREAMING"
    TOOL_CALLING = "TOOL_CALLING"
    STRUCTURED_OUTPUT = "STRUCTURED_OUTPUT"
    NATIVE_STRUCTURED_OUTPUT = "NATIVE_STRUCTURED_OUTPUT"
    SYSTEM_PROMPT = "SYSTEM_PROMPT"
    TOOL_APPROVAL = "TOOL_APPROVAL"
    VISION = "VISION"
    AUDIO = "AUDIO"
    MULTI_MODAL = "MULTI_MODAL"
    PROMPT_CACHING = "PROMPT_CACHING"
    PER_REQUEST_RETRY = "PER_REQUEST_RETRY"
    TOKEN_USAGE = "TOKEN_USAGE"  # noqa: S105 - a capability name, not a secret
    CONVERSATION_MEMORY = "CONVERSATION_MEMORY"
    TOOL_CALL_DELTA = "TOOL_CALL_DELTA"
    MODEL_ENUMERATION = "MODEL_ENUMERATION"
    BUDGET_ENFORCEMENT = "BUDGET_ENFORCEMENT"
    CONFIDENCE_SCORES = "CONFIDENCE_SCORES"
    PASSIVATION = "PASSIVATION"
    CANCELLATION = "CANCELLATION"
    AGENT_ORCHESTRATION = "AGENT_ORCHESTRATION"
    PLANNING = "PLANNING"
    VIRTUAL_FILESYSTEM = "VIRTUAL_FILESYSTEM"
    CLIENT_TOOLS = "CLIENT_TOOLS"
    """The caller's own functions offered beside the agent's tools, their calls handed back to it
    (the OpenAI doors as a governed model gateway), and its `response_format` asked for as sent."""
