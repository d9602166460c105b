"""The PydanticAI runtime: Atmosphere agents executed by PydanticAI's agent loop, and hosted PydanticAI agents.

Why a runtime of its own: teams that already build on PydanticAI keep its loop (its validation,
retries and output handling) while the platform keeps what only it can do: every tool call
passes dispatch's one choke point (`ctx.run_tool`: validation, governance, approval, journal,
screening), and the run streams, reports usage and ends the way every runtime's does.

Two uses, one runtime (`pydantic-ai`):

- an `@agent(runtime="pydantic-ai")`: a `pydantic_ai.Agent` is built per run from the request
  (system prompt, history, message) with the agent's tools as a toolset whose calls go to
  `ctx.run_tool`, on an `OpenAIChatModel` (chat completions) at `LLM_BASE_URL`;
- `hosted_agent("name", agent)`: the user's own `pydantic_ai.Agent` runs with its own
  instructions, tools and loop; a run-level capability wraps its toolset so that each call
  passes `ctx.run_tool` with `local` set to the tool itself (see `_hosting`). An agent with no
  model, or only a model name, runs on the platform's configured model; a model object it
  carries is kept.

Durable runs: PydanticAI cannot replay a journaled model round, so this runtime ignores
`ctx.rounds`: a resumed run calls the model again for each round, while the tool effects of the
rounds before the interruption are replayed by the choke point (never run twice).
"""

from atmosphere.runtimes.pydantic_ai._runtime import PydanticAiAgentRuntime

__all__ = ["PydanticAiAgentRuntime"]
