"""The AgentScope runtime: Atmosphere agents executed by AgentScope's agent loop, and hosted AgentScope agents.

Why a runtime of its own: teams that build on AgentScope keep its reasoning-acting loop, its
task-list planning and its toolkit, while the platform keeps what only it can do: every tool
call passes dispatch's one choke point (`ctx.run_tool`: validation, governance, approval,
journal, screening), and the run streams, reports usage and ends the way every runtime's does.

Two uses, one runtime (`agentscope`):

- an `@agent(runtime="agentscope")`: an `agentscope.agent.Agent` (AgentScope 2's ReAct agent) is
  built per run from the request (system prompt, history, message) on an `OpenAIChatModel` at
  `LLM_BASE_URL`, its tools declared in a toolkit whose every call goes to `ctx.run_tool`. With
  the planning harness (PLANNING is native here: dispatch hands `write_todos` over as
  `ctx.store_tools`), AgentScope's task tools are the model's plan surface and each change of
  the task list is mirrored into the plan store (`_plan`);
- `hosted_agent("name", agent)`: the user's own `Agent` runs with its own prompt, model, tools,
  middlewares and loop, on a per-run copy (its state is per conversation) whose tools pass
  `ctx.run_tool` with `local` set to the tool itself (see `_hosting`).

Not declared: STRUCTURED_OUTPUT and NATIVE_STRUCTURED_OUTPUT (AgentScope forces a
`generate_structured_output` tool call; it neither heals a text answer by reprompting nor sends
`response_format`).

Durable runs: AgentScope cannot replay a journaled model round, so this runtime ignores
`ctx.rounds`: a resumed run calls the model again for each round, while the tool effects of the
rounds before the interruption are replayed by the choke point (never run twice).
"""

from atmosphere.runtimes.agentscope._runtime import AgentScopeAgentRuntime

__all__ = ["AgentScopeAgentRuntime"]
