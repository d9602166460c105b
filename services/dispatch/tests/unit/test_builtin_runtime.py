from atmosphere.dispatch.runtime.openai import BuiltInAgentRuntime
from atmosphere.sdk.host import AiCapability
from atmosphere.sdk.runtime import AgentRuntime, RuntimeConfig
from atmosphere.testing.runtime_contract import AgentRuntimeContract


class TestBuiltInRuntimeContract(AgentRuntimeContract):
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
            AiCapability.CLIENT_TOOLS,
        }
    )

    def make_runtime(self, config: RuntimeConfig) -> AgentRuntime:
        return BuiltInAgentRuntime(config)
