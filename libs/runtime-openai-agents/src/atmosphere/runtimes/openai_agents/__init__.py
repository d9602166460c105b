"""The OpenAI Agents SDK runtime: Atmosphere agents executed by the SDK's runner, and hosted `agents.Agent`s.

Why a runtime of its own: teams that already build on the Agents SDK keep its runner (its tool
execution, handoffs and guardrails) while the platform keeps what only it can do: every tool
call passes dispatch's one choke point (`ctx.run_tool`: validation, governance, approval,
journal, screening), and the run streams, reports usage and ends the way every runtime's does.

Two uses, one runtime (`openai-agents`):

- an `@agent(runtime="openai-agents")`: an `agents.Agent` is built per run from the request
  (system prompt as instructions, history, message) with the agent's tools as `FunctionTool`s
  whose calls go to `ctx.run_tool`, on an `OpenAIChatCompletionsModel` over an `AsyncOpenAI`
  client at `LLM_BASE_URL`, and run with `Runner.run_streamed`;
- `hosted_agent("name", agent)`: the user's own `agents.Agent` runs with its own instructions,
  tools and handoffs, as a clone whose function tools pass `ctx.run_tool` with `local` set to
  the tool itself (see `_hosting`). An agent with no model, or only a model name, runs on the
  platform's configured model; a `Model` object it carries is kept.

Tracing is disabled for every run (`RunConfig(tracing_disabled=True)`): the SDK would export
traces to api.openai.com, and this runtime talks to the configured base URL only.

Durable runs: the SDK cannot replay a journaled model round, so this runtime ignores
`ctx.rounds`: a resumed run calls the model again for each round, while the tool effects of the
rounds before the interruption are replayed by the choke point (never run twice).
"""

from atmosphere.runtimes.openai_agents._runtime import OpenAiAgentsRuntime

__all__ = ["OpenAiAgentsRuntime"]
