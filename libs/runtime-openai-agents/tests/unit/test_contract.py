from atmosphere.runtimes.openai_agents import OpenAiAgentsRuntime
from atmosphere.sdk.host import AiCapability
from atmosphere.sdk.runtime import AgentRuntime, RuntimeConfig
from atmosphere.testing.runtime_contract import AgentRuntimeContract


class TestOpenAiAgentsRuntimeContract(AgentRuntimeContract):
    # Not STRUCTURED_OUTPUT / NATIVE_STRUCTURED_OUTPUT: the SDK cannot heal an answer that does
    # not match the output type (it fails the run), which the contract's structured tests require.
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
            AiCapability.MODEL_ENUMERATION,
        }
    )

    def make_runtime(self, config: RuntimeConfig) -> AgentRuntime:
        return OpenAiAgentsRuntime(config)
