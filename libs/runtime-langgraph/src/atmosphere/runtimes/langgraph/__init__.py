"""The `langgraph` runtime: Atmosphere agents run as LangGraph graphs, and users' own graphs hosted.

Two uses, one adapter:

- `@agent(runtime="langgraph")`: the agent becomes an explicit `StateGraph` (a model node with the
  agent's tools bound, a `ToolNode`, the tool-loop policy as its routing), compiled per run and
  streamed with `stream_mode="messages"`. The model is LangChain's `ChatOpenAI` on the configured
  OpenAI-compatible provider; the tools are LangChain tools whose every call goes through
  dispatch's choke point (`ctx.run_tool`), so governance, approval and the journal see them all.
- `hosted_agent("name", graph)`: any compiled graph except `create_agent`'s (the `langchain` runtime
  hosts those, so no object has two hosts) runs with its own prompt, model and loop, fed the
  history and the user's message as `{"messages": [...]}`; its ToolNodes' calls pass the choke point
  with `ToolCallRequest.local` set, which alone runs the original tool.

Errors end the run with the built-in runtime's texts and codes (`API returned 400: <message>`,
`Tool loop exhausted after N iterations`). Cancelling the task running `execute` cancels the graph's
tasks, which closes the provider's HTTP stream.

Not declared: STRUCTURED_OUTPUT and NATIVE_STRUCTURED_OUTPUT (the contract's self-healing reprompt
and its fallback from a refused `response_format` to prompt instructions are the built-in runtime's
own loop, which LangGraph does not have), and the capabilities the contract suite does not test.

Durable runs: LangGraph cannot replay a journaled model round, so `ctx.rounds` is ignored. A resumed
run calls the model again for every round; its tool calls' effects are still replayed, not redone,
because each goes through the choke point, which consults the journal.

This package holds only the runtime class (`_runtime`, light: dispatch imports it at every start)
and the graph a run builds (`_graph`, the one module importing LangGraph, on a run's first use); the
engine, the provider, streaming, failures, tools and hosting live in `atmosphere.langchain_bridge`.
"""

from atmosphere.runtimes.langgraph._runtime import LangGraphAgentRuntime

__all__ = ["LangGraphAgentRuntime"]
