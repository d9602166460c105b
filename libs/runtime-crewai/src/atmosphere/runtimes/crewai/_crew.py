"""The crew a run kicks off: one built for an Atmosphere agent, or a gated copy of the user's own.

An Atmosphere agent (or `@coordinator`) is a crew of one agent and one task. The agent's role is
the agent's name, its backstory its system prompt; the task's description is the user's message.
Its tools are `GatedTool`s over the agent's `ToolSpec`s; a coordinator's `delegate_task` and
`task` are among them, so its fleet is reached through the platform's governed delegation (each
member a run of its own, in its own pool) and not through CrewAI's delegation between crew
members. Its model is given the platform's conversation (`GatedExecutor`).

A hosted crew runs as a copy per run (`Crew.copy`, what CrewAI's own `kickoff_for_each` does: a
crew's agents and tasks keep state while they run, so one object cannot serve concurrent runs).
In the copy, every agent's and every task's own tools are `GatedTool`s over them, every agent's
loop is a `GatedExecutor`, and an agent whose LLM names no endpoint of its own runs on the
platform's (`keeps_own_llm`). What cannot be gated is refused before the run starts: tools
CrewAI would add to an agent at kickoff from an MCP server (`mcps`) or from CrewAI's platform
apps (`apps`). CrewAI's delegation tools (an agent with `allow_delegation`, or a hierarchical
crew's manager) hand work to another agent of the same crew, whose own tool calls are gated:
they are the crew's orchestration and run as CrewAI runs them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from crewai import Agent, Crew, Task
from crewai.llms.base_llm import BaseLLM
from crewai.tools import BaseTool
from crewai.utilities.agent_utils import convert_tools_to_openai_schema
from crewai.utilities.string_utils import sanitize_tool_name

from atmosphere.bus.errors import RuntimeFailedError
from atmosphere.runtimes.crewai._executor import GatedExecutor
from atmosphere.runtimes.crewai._llm import PlatformLLM
from atmosphere.runtimes.crewai._tools import Gate, GatedTool
from atmosphere.sdk import AiRequest
from atmosphere.sdk.builtin_tools import DELEGATE_TASK
from atmosphere.sdk.runtime import AgentExecutionContext, ToolSpec

EXPECTED_OUTPUT = "A complete, direct answer to the user's message."
AGENT_GOAL = "Answer the user's message."
COORDINATOR_GOAL = "Answer the user's message, handing subtasks to your fleet's agents with delegate_task."
LONE_AGENT_TASK = "{message}"
"""The task a hosted lone `crewai.Agent` is given: the user's message."""


class UnhostableCrewError(Exception):
    """The crew has an agent whose tools could not pass the platform's tool gate, or lacks an input."""

    code = RuntimeFailedError.code


def built_crew(ctx: AgentExecutionContext, llm: PlatformLLM, gate: Gate) -> Crew:
    """The crew of one agent and one task that answers `ctx.request` (see the module)."""
    coordinator = any(spec.name == DELEGATE_TASK.name for spec in ctx.tools)
    agent = Agent(
        role=ctx.agent,
        goal=COORDINATOR_GOAL if coordinator else AGENT_GOAL,
        backstory=ctx.request.system_prompt,
        llm=llm,
        tools=[GatedTool.of_spec(spec, gate) for spec in ctx.tools],
        executor_class=GatedExecutor,
        # The platform's tool loop ends a run (its cap's rounds, a refused one, the answer), not CrewAI's.
        max_iter=ctx.tool_loop.cap + 3,
        # A failed attempt is the run's failure: the provider's retries happened already.
        max_retry_limit=0,
        allow_delegation=False,
        # The platform keeps the conversation within the model's window (memory, compaction).
        respect_context_window=False,
        verbose=False,
    )
    task = Task(description=ctx.request.message or "(empty message)", expected_output=EXPECTED_OUTPUT, agent=agent)
    return Crew(agents=[agent], tasks=[task], verbose=False, tracing=False)


def crew_of(native: object) -> Crew:
    """The crew a hosted object is: a `Crew`, or a lone `Agent` given the user's message as its task."""
    if isinstance(native, Crew):
        return native
    if isinstance(native, Agent):
        task = Task(description=LONE_AGENT_TASK, expected_output=EXPECTED_OUTPUT, agent=native)
        return Crew(agents=[native], tasks=[task], verbose=False, tracing=False)
    msg = f"the crewai runtime cannot host a {type(native).__qualname__}"
    raise TypeError(msg)


def hosted_crew(native: object, gate: Gate, platform_llm: Callable[[], PlatformLLM]) -> Crew:
    """A copy of the hosted crew for one run, every tool of which passes `gate` (see the module).

    Raises:
        UnhostableCrewError: an agent would get tools at kickoff that cannot be gated.
    """
    crew = crew_of(native)
    originals = _agents_of(crew)
    for agent in originals:
        _check_hostable(agent)
    copy = crew.copy()
    gated: dict[int, GatedTool] = {}

    def gated_tools(tools: Iterable[BaseTool]) -> list[BaseTool]:
        wrapped: list[BaseTool] = []
        for tool in tools:
            if id(tool) not in gated:
                gated[id(tool)] = GatedTool.of_native(tool, sanitize_tool_name(tool.name), gate)
            wrapped.append(gated[id(tool)])
        return wrapped

    for original, agent in zip(originals, _agents_of(copy), strict=True):
        agent.tools = gated_tools(original.tools or [])
        agent.executor_class = GatedExecutor
        if not keeps_own_llm(agent):
            agent.llm = platform_llm()
    for original_task, task in zip(crew.tasks, copy.tasks, strict=True):
        if original_task.tools:
            task.tools = gated_tools(original_task.tools)
    copy.tracing = False
    # The run streams through CrewAI's event sink; a streaming kickoff would hand back an iterator instead.
    copy.stream = False
    return copy


def keeps_own_llm(agent: Any) -> bool:
    """Whether a hosted agent runs on its own LLM: one given an endpoint of its own (`base_url`, `api_base`).

    CrewAI gives an agent without an LLM one from the environment (`MODEL`, `OPENAI_API_KEY`),
    and an LLM given only a model name calls that provider's public API with keys from the
    environment: either would bypass the configured `LLM_BASE_URL`, so those agents run on the
    platform's model instead.
    """
    llm = agent.llm
    return isinstance(llm, BaseLLM) and bool(llm.base_url or getattr(llm, "api_base", None))


def native_tool_specs(native: object) -> tuple[ToolSpec, ...]:
    """Every tool of every agent and task of the hosted crew, as the model is shown it (the first of a name wins)."""
    crew = crew_of(native)
    specs: dict[str, ToolSpec] = {}
    tools = [tool for agent in _agents_of(crew) for tool in agent.tools or []]
    tools += [tool for task in crew.tasks for tool in task.tools or []]
    for tool in tools:
        name = sanitize_tool_name(tool.name)
        if name not in specs:
            specs[name] = _spec(tool, name)
    return tuple(specs.values())


def _spec(tool: BaseTool, name: str) -> ToolSpec:
    [schema], _, _ = convert_tools_to_openai_schema([tool])
    return ToolSpec(name=name, description=tool.description, parameters=schema["function"]["parameters"])


def _agents_of(crew: Crew) -> list[Any]:
    """The crew's agents, its manager agent last (a hierarchical crew's, when the user gave one)."""
    return [*crew.agents, *([crew.manager_agent] if crew.manager_agent is not None else [])]


def _check_hostable(agent: Any) -> None:
    reasons = [field for field, value in (("mcps", agent.mcps), ("apps", agent.apps)) if value]
    if reasons:
        msg = (
            f"crew agent '{agent.role}' has {', '.join(reasons)}: CrewAI adds those tools at kickoff, past the "
            "platform's tool gate; give the agent the tools themselves instead"
        )
        raise UnhostableCrewError(msg)


def kickoff_inputs(crew: Crew, request: AiRequest) -> dict[str, Any]:
    """The inputs a hosted crew is kicked off with (see the README).

    `message` is the user's message and `history` the earlier turns as text; a message that is a
    JSON object also gives each of its keys the crew declares (`{topic}` in a task's
    description). With history (or a system prompt the platform adds, such as a memory
    summary), CrewAI's own `crew_chat_messages` adds the conversation to every task's description.

    Raises:
        UnhostableCrewError: the crew declares an input the request does not give.
    """
    history = [{"role": m.role, "content": m.content} for m in request.history]
    if request.system_prompt:
        history.insert(0, {"role": "system", "content": request.system_prompt})
    inputs: dict[str, Any] = {}
    declared = crew.fetch_inputs()
    payload = _json_object(request.message)
    inputs |= {key: value for key, value in payload.items() if key in declared}
    inputs |= {"message": request.message, "history": "\n".join(f"{m['role']}: {m['content']}" for m in history)}
    if history:
        inputs["crew_chat_messages"] = json.dumps([*history, {"role": "user", "content": request.message}])
    missing = sorted(declared - inputs.keys())
    if missing:
        msg = (
            f"the crew needs the input(s) {', '.join(missing)}: send the message as a JSON object with them "
            "(message and history are given)"
        )
        raise UnhostableCrewError(msg)
    return inputs


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
