"""The runtime contract on OpenAI's wire, and PLANNING: AgentScope's task list is the platform's plan."""

import json
from typing import ClassVar

from atmosphere.runtimes.agentscope import AgentScopeAgentRuntime
from atmosphere.sdk import AiRequest, ToolLoopPolicy
from atmosphere.sdk.builtin_tools import WRITE_TODOS
from atmosphere.sdk.host import AiCapability
from atmosphere.sdk.runtime import AgentRuntime, RuntimeConfig
from atmosphere.testing.model_turns import ToolCallScript, Turn
from atmosphere.testing.runtime_contract import WEATHER, AgentRuntimeContract, Recorder, context
from atmosphere.testing.scripted_model import ScriptedModel


class TestAgentScopeRuntimeContract(AgentRuntimeContract):
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
            AiCapability.PLANNING,
        }
    )
    CAPABILITY_TESTS: ClassVar[dict[AiCapability, tuple[str, ...]]] = {
        **AgentRuntimeContract.CAPABILITY_TESTS,
        AiCapability.PLANNING: ("test_the_task_list_is_the_plan_the_platform_stores",),
    }

    def make_runtime(self, config: RuntimeConfig) -> AgentRuntime:
        return AgentScopeAgentRuntime(config)

    async def test_the_task_list_is_the_plan_the_platform_stores(self, fake_provider: ScriptedModel) -> None:
        # The native plan surface: the model plans with AgentScope's task tools, never `write_todos`,
        # and each change of the list reaches the store dispatch hands over (`ctx.store_tools`).
        fake_provider.script(
            Turn.tool_calls(
                ToolCallScript("TaskCreate", {"subject": "Find flights", "description": "."}, call_id="c1")
            ),
            Turn.tool_calls(ToolCallScript("TaskUpdate", {"task_id": "1", "status": "completed"}, call_id="c2")),
            Turn.text("Flights found."),
        )
        recorder = Recorder()
        runtime = self.runtime_for(fake_provider)
        try:
            ctx = context(
                recorder,
                AiRequest(message="Plan my trip."),
                tools=(WEATHER,),
                store_tools=(WRITE_TODOS,),
                tool_loop=ToolLoopPolicy.max_iterations(4),
            )
            await runtime.execute(ctx, recorder.session)
        finally:
            await runtime.aclose()
        offered = {t["function"]["name"] for t in fake_provider.requests[0]["tools"]}
        assert "write_todos" not in offered
        assert {"TaskCreate", "TaskUpdate"} <= offered
        plans = [json.loads(c.arguments_json)["todos"] for c in recorder.tool_calls if c.name == WRITE_TODOS.name]
        assert [[(t["content"], t["status"]) for t in plan] for plan in plans] == [
            [("Find flights", "pending")],
            [("Find flights", "completed")],
        ]
        assert recorder.text() == "Flights found."
