"""The runtime contract on Cohere's v2 wire, and what only Cohere's Chat API has."""

from __future__ import annotations

from atmosphere.runtimes.cohere import CohereAgentRuntime
from atmosphere.sdk.host import AiCapability
from atmosphere.sdk.runtime import AgentRuntime, RuntimeConfig
from atmosphere.testing.runtime_contract import COHERE_WIRE, AgentRuntimeContract


class TestCohereRuntimeContract(AgentRuntimeContract):
    wire = COHERE_WIRE
    expected_capabilities = frozenset(
        {
            AiCapability.TEXT_STREAMING,
            AiCapability.SYSTEM_PROMPT,
            AiCapability.CONVERSATION_MEMORY,
            AiCapability.TOOL_CALLING,
            AiCapability.TOOL_CALL_DELTA,
            AiCapability.TOKEN_USAGE,
            AiCapability.PER_REQUEST_RETRY,
            AiCapability.CANCELLATION,
            AiCapability.STRUCTURED_OUTPUT,
            AiCapability.NATIVE_STRUCTURED_OUTPUT,
            AiCapability.MODEL_ENUMERATION,
        }
    )

    def make_runtime(self, config: RuntimeConfig) -> AgentRuntime:
        return CohereAgentRuntime(config)
