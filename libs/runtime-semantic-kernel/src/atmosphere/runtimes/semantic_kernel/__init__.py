"""The Semantic Kernel runtime: Atmosphere agents executed by SK's `ChatCompletionAgent`, and hosted SK agents.

Why a runtime of its own: teams that already build on Semantic Kernel keep its agent (its
kernel, plugins, filters, execution settings and function-choice behaviour) while the platform
keeps what only it can do: every function call passes dispatch's one choke point
(`ctx.run_tool`: validation, governance, approval, journal, screening), and the run streams,
reports usage and ends the way every runtime's does.

Two uses, one runtime (`semantic-kernel`):

- an `@agent(runtime="semantic-kernel")`: a `ChatCompletionAgent` is built per run from the
  request (the system prompt and history as its thread's chat history, the message) on SK's
  `OpenAIChatCompletion` over an `AsyncOpenAI` client at `LLM_BASE_URL`; the agent's tools are
  offered as declared and each call of SK's auto-invocation loop goes to `ctx.run_tool` (see
  `_tools`), within the tool loop; streamed with `invoke_stream`;
- `hosted_agent("name", agent)`: the user's own `ChatCompletionAgent` runs with its own
  instructions, kernel, execution settings and function-choice behaviour, on a clone of its
  kernel whose auto-function-invocation filter hands each call to `ctx.run_tool` with `local`
  set to the kernel function (see `_hosting`). Its own chat service is kept; an agent without
  one runs on the platform's configured model.

Telemetry: SK's OpenTelemetry diagnostics and its version headers are off unless the process's
environment turns them on (`_runtime.QUIET_FRAMEWORK`, set before SK is first imported).

Durable runs: SK cannot replay a journaled model round, so this runtime ignores `ctx.rounds`: a
resumed run calls the model again for each round, while the tool effects of the rounds before
the interruption are replayed by the choke point (never run twice).
"""

from atmosphere.runtimes.semantic_kernel._runtime import SemanticKernelAgentRuntime

__all__ = ["SemanticKernelAgentRuntime"]
