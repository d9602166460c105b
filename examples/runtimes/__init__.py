"""One agent on every runtime, and each framework's own object hosted: run either with `make run`.

    ATMOSPHERE_APP=examples.runtimes.pinned:app make run    # `forecaster-<runtime>` on each runtime
    ATMOSPHERE_APP=examples.runtimes.hosted:app make run    # a LangChain agent, a LangGraph graph, ...

`atmosphere dev` starts a dispatch pool per runtime the app pins. The OpenAI-wire runtimes use the
stack's model (`LLM_*`, the local model by default); the `anthropic` one needs `ANTHROPIC_API_KEY`
(without it its pool reports `INACTIVE(no Anthropic credentials: set ANTHROPIC_API_KEY)` and its
agent's runs end with that reason).
"""
