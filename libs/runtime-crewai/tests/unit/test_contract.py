"""The runtime contract, on OpenAI's wire; AGENT_ORCHESTRATION is pinned here (the suite has no test for it)."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest
from crewai import Agent, Crew, Task

from atmosphere.runtimes.crewai import CrewAiAgentRuntime
from atmosphere.sdk import AiRequest
from atmosphere.sdk.host import AiCapability
from atmosphere.sdk.runtime import AgentRuntime, RuntimeConfig
from atmosphere.testing.model_turns import Turn
from atmosphere.testing.runtime_contract import AgentRuntimeContract, Recorder, context
from atmosphere.testing.scripted_model import ScriptedModel

# CrewAI reads its own deprecated fields while it builds an agent (`function_calling_llm`): its
# warnings, not this adapter's, which the suite would otherwise turn into errors.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:crewai")


class TestCrewAiRuntimeContract(AgentRuntimeContract):
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
            AiCapability.AGENT_ORCHESTRATION,
        }
    )
    CAPABILITY_TESTS: ClassVar[dict[AiCapability, tuple[str, ...]]] = {
        **AgentRuntimeContract.CAPABILITY_TESTS,
        AiCapability.AGENT_ORCHESTRATION: ("test_a_crews_agents_report_their_progress_before_the_answer",),
    }

    def make_runtime(self, config: RuntimeConfig) -> AgentRuntime:
        return CrewAiAgentRuntime(config)

    async def test_a_crews_agents_report_their_progress_before_the_answer(self, fake_provider: ScriptedModel) -> None:
        self.require(AiCapability.AGENT_ORCHESTRATION)
        fake_provider.script(Turn.text("Three sources found."), Turn.text("A short report."))
        researcher = Agent(role="researcher", goal="Find sources", backstory="You dig.")
        writer = Agent(role="writer", goal="Write the report", backstory="You write.")
        crew = Crew(
            agents=[researcher, writer],
            tasks=[
                Task(
                    description="Find sources on {message}",
                    expected_output="Sources",
                    agent=researcher,
                    name="research",
                ),
                Task(description="Write a report", expected_output="A report", agent=writer, name="write"),
            ],
        )
        recorder = Recorder()
        runtime = self.runtime_for(fake_provider)
        try:
            await runtime.execute(context(recorder, AiRequest(message="tides"), native=crew), recorder.session)
        finally:
            await runtime.aclose()
        steps = [
            (e.agent_step.step_name, json.loads(e.agent_step.data_json)["agent"])
            for e in recorder.events
            if e.WhichOneof("kind") == "agent_step"
        ]
        assert steps == [
            ("crewai.task.started", "researcher"),
            ("crewai.agent.started", "researcher"),
            ("crewai.agent.completed", "researcher"),
            ("crewai.task.completed", "researcher"),
            ("crewai.task.started", "writer"),
            ("crewai.agent.started", "writer"),
            ("crewai.agent.completed", "writer"),
            ("crewai.task.completed", "writer"),
        ]
        kinds = recorder.kinds()
        last_step = max(i for i, kind in enumerate(kinds) if kind == "agent_step")
        first_text = kinds.index("text_delta")
        # The researcher's task ends before the writer's answer streams; the answer is the writer's alone.
        assert kinds.index("agent_step") < first_text
        assert recorder.text() == "A short report."
        assert last_step < kinds.index("complete")
        assert "Find sources on tides" in json.dumps(fake_provider.requests[0]["messages"])
