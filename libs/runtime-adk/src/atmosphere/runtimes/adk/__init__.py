"""Run Atmosphere agents on Google's Agent Development Kit, and host your own ADK agents (`AdkAgentRuntime`).

Registered under the `atmosphere.runtimes` entry point `adk`; dispatch picks it when it is
available (`GOOGLE_API_KEY`, `GEMINI_API_KEY` or `GOOGLE_GEMINI_BASE_URL` in
`RuntimeConfig.extra`) and no runtime of a higher priority is.

Two uses, one runtime (`adk`):

- an `@agent(runtime="adk")`: an ADK `LlmAgent` is built per run from the request (its system
  prompt, history and message) with the agent's tools as ADK tools whose calls go to
  `ctx.run_tool`, on Gemini natively through `google-genai`;
- `hosted_agent("name", agent)`: the user's own ADK agent — an `LlmAgent`, one with sub-agents it
  transfers to, a workflow agent — runs with its own instructions, tools and callbacks; a plugin
  routes each tool call through `ctx.run_tool` with `local` set to the tool itself (`_gate`),
  and its artifacts are kept in the conversation's workspace (`_artifacts`).

Durable runs: ADK's loop cannot replay a journaled model round, so this runtime ignores
`ctx.rounds`: a resumed run calls the model again for each round, while the tool effects of the
rounds before the interruption are replayed by the choke point (never run twice).
"""

from atmosphere.runtimes.adk._runtime import AdkAgentRuntime
from atmosphere.runtimes.adk._settings import (
    API_KEY,
    BASE_URL,
    DEFAULT_MODEL,
    GEMINI_API_KEY,
    MODEL,
    SETTINGS,
    GeminiSettings,
)

__all__ = [
    "API_KEY",
    "BASE_URL",
    "DEFAULT_MODEL",
    "GEMINI_API_KEY",
    "MODEL",
    "SETTINGS",
    "AdkAgentRuntime",
    "GeminiSettings",
]
