"""The CrewAI runtime: Atmosphere agents run as crews, and your own crews are hosted, in process.

Why a runtime of its own: teams that orchestrate with CrewAI keep its crews (agents with roles,
tasks, sequential or hierarchical processes) while the platform keeps what only it can do: every
tool call passes dispatch's one choke point (`ctx.run_tool`: validation, governance, approval,
journal, screening), and the run streams, reports usage and ends the way every runtime's does.
No sidecar: CrewAI is Python, and runs in dispatch's process.

Two uses, one runtime (`crewai`):

- an `@agent(runtime="crewai")` (or `@coordinator`): a crew of one agent and one task is built per
  run; the agent's tools are CrewAI tools whose calls go to `ctx.run_tool` (a coordinator's
  `delegate_task` and `task` among them: its fleet is reached through the platform's governed
  delegation, not through CrewAI's), and the model sees the platform's conversation (system
  prompt, history, message) exactly as on every other runtime;
- `hosted_agent("name", crew)`: the user's own `crewai.Crew` (or `crewai.Agent`) runs as a copy
  per run whose every agent's and task's tools pass `ctx.run_tool` with `local` set to the tool
  itself; its agents keep an LLM they were given, the others use the platform's.

Progress: each task's and each agent's start and end are streamed as `agent_step` events
(`crewai.task.started`, `crewai.agent.started`, `crewai.agent.completed`,
`crewai.task.completed`, `crewai.task.failed`) before the answer, read from CrewAI's event bus
through a sink scoped to the run (`crewai.events.stream_context`), so concurrent runs never see
each other's events.

Durable runs: CrewAI cannot replay a journaled model round, so this runtime ignores
`ctx.rounds`: a resumed run runs the crew again, while the tool effects of the calls before the
interruption are replayed by the choke point (never run twice).
"""

from atmosphere.runtimes.crewai._runtime import CrewAiAgentRuntime

__all__ = ["CrewAiAgentRuntime"]
