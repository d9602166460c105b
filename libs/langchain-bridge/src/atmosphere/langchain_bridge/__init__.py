"""What the `langchain` and `langgraph` runtimes share: LangGraph graphs run against Atmosphere's choke point.

A library of the two runtime adapters (`atmosphere-ai-runtime-langchain`,
`atmosphere-ai-runtime-langgraph`); it registers no runtime of its own. Its modules:

- `runtime` (light: imports no framework, only `atmosphere.sdk`, since dispatch loads every runtime's
  entry point when it starts): `GraphRuntime`, the base of both runtime classes (availability,
  capabilities, which graphs are LangChain agents), delegating the rest to the engine it imports on
  first use;
- `engine`: `GraphEngine`, one run of a graph, the runtime's own (from its builder) or the user's
  hosted one, streamed into the session;
- `provider` (the OpenAI-compatible provider as LangChain's `ChatOpenAI`), `relay` (the conversation
  in, the streamed answer out), `tools` (`ToolSpec`s as LangChain tools calling the choke point),
  `hosting` (a hosted graph's tools found and governed), `failures` (the built-in runtime's error
  texts and codes).

Importing this package imports no framework either; every module but `runtime` does.
"""
