"""The LlamaIndex runtime: Atmosphere agents executed by LlamaIndex's agent workflow, and hosted LlamaIndex agents.

Why a runtime of its own: teams that already build on LlamaIndex keep its agents (their turns, tool
handling, handoffs between the agents of an `AgentWorkflow`) while the platform keeps what only it
can do: every tool call passes dispatch's one choke point (`ctx.run_tool`: validation, governance,
approval, journal, screening), and the run streams, reports usage and ends the way every runtime's
does.

Two uses, one runtime (`llamaindex`):

- an `@agent(runtime="llamaindex")`: a `FunctionAgent` is built per run from the request (system
  prompt, history, message) with the agent's tools, on `OpenAILike` (chat completions) at
  `LLM_BASE_URL`;
- `hosted_agent("name", agent)`: the user's own `FunctionAgent`, `ReActAgent` or `AgentWorkflow`
  runs with its own prompts, tools and handoffs; an agent without an LLM of its own runs on the
  platform's model.

Either way the agents run as steps of one gated `AgentWorkflow` (`_workflow`), which hands each tool
call to `ctx.run_tool` (a hosted agent's own tool as the call's `local`).

Durable runs: LlamaIndex cannot replay a journaled model round, so this runtime ignores
`ctx.rounds`: a resumed run calls the model again for each round, while the tool effects of the
rounds before the interruption are replayed by the choke point (never run twice).
"""

from atmosphere.runtimes.llamaindex._runtime import LlamaIndexAgentRuntime

__all__ = ["LlamaIndexAgentRuntime"]
