from atmosphere.langchain_bridge.runtime import CAPABILITIES
from atmosphere.runtimes.langgraph import LangGraphAgentRuntime
from atmosphere.sdk.runtime import AgentRuntime, RuntimeConfig
from atmosphere.testing.runtime_contract import AgentRuntimeContract


class TestLangGraphRuntimeContract(AgentRuntimeContract):
    """The contract, on the flags the bridge declares for both runtimes (pinned in its test_runtime.py)."""

    expected_capabilities = CAPABILITIES  # not STRUCTURED_OUTPUT / NATIVE_STRUCTURED_OUTPUT: see the package

    def make_runtime(self, config: RuntimeConfig) -> AgentRuntime:
        return LangGraphAgentRuntime(config)
