"""The `langchain` runtime: Atmosphere agents run on LangChain's agent loop, and users' own agents hosted.

Two uses, one adapter:

- `@agent(runtime="langchain")`: the agent becomes a LangChain agent (`create_agent`) per run, with
  LangChain's `ChatOpenAI` on the configured OpenAI-compatible provider, the agent's system prompt,
  and its tools as LangChain tools whose every call goes through dispatch's choke point
  (`ctx.run_tool`), so governance, approval and the journal see them all. The tool-loop policy and
  the call deadline are middleware around each model call; the agent is streamed with
  `stream_mode="messages"`.
- `hosted_agent("name", agent)`: an agent `create_agent` made (any other compiled graph is the
  `langgraph` runtime's, so no object has two hosts) runs with its own prompt, model, tools and
  middleware, fed the history and the user's message as `{"messages": [...]}`; its tool calls pass
  the choke point with `ToolCallRequest.local` set, which alone runs the original tool.

Errors end the run with the built-in runtime's texts and codes (`API returned 400: <message>`,
`Tool loop exhausted after N iterations`). Cancelling the task running `execute` cancels the agent's
tasks, which closes the provider's HTTP stream.

Not declared: STRUCTURED_OUTPUT and NATIVE_STRUCTURED_OUTPUT. LangChain's own structured output
(`create_agent(response_format=...)`) does not do what the contract pins: its provider strategy fails
at the first answer that does not validate and never falls back to prompt instructions when the
provider refuses `response_format`, and its tool strategy heals through a tool call, not a reprompt.
Nor are the capabilities the contract suite does not test.

Durable runs: LangChain cannot replay a journaled model round, so `ctx.rounds` is ignored. A resumed
run calls the model again for every round; its tool calls' effects are still replayed, not redone,
because each goes through the choke point, which consults the journal.

Layout: `_runtime` is all dispatch imports to discover the runtime (no framework); `_agent`, which
imports LangChain, builds each run's agent. Everything else, shared with the `langgraph` runtime, is
`atmosphere-ai-langchain-bridge`'s (`atmosphere.langchain_bridge`).
"""

from atmosphere.runtimes.langchain._runtime import LangChainAgentRuntime

__all__ = ["LangChainAgentRuntime"]
