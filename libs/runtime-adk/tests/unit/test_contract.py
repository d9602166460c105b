"""The ADK runtime against the runtime contract, on the Gemini API's wire."""

from __future__ import annotations

from atmosphere.runtimes.adk import AdkAgentRuntime
from atmosphere.sdk.host import AiCapability
from atmosphere.sdk.runtime import AgentRuntime, RuntimeConfig
from atmosphere.testing.runtime_contract import GEMINI_WIRE, AgentRuntimeContract


class TestAdkAgentRuntimeContract(AgentRuntimeContract):
    # Not TOOL_CALL_DELTA: Gemini sends each function call whole (one delta per call, never the
    # fragments the contract asks for). Not STRUCTURED_OUTPUT / NATIVE_STRUCTURED_OUTPUT: ADK's
    # `output_schema` validates an answer but cannot heal one that does not fit.
    expected_capabilities = frozenset(
        {
            AiCapability.TEXT_STREAMING,
            AiCapability.SYSTEM_PROMPT,
            AiCapability.CONVERSATION_MEMORY,
            AiCapability.TOOL_CALLING,
            AiCapability.TOKEN_USAGE,
            AiCapability.PER_REQUEST_RETRY,
            AiCapability.CANCELLATION,
            AiCapability.MODEL_ENUMERATION,
        }
    )
    wire = GEMINI_WIRE

    def make_runtime(self, config: RuntimeConfig) -> AgentRuntime:
        return AdkAgentRuntime(config)
