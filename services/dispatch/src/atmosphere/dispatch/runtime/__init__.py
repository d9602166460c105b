"""The built-in `AgentRuntime`: any OpenAI-compatible chat-completions provider over httpx."""
