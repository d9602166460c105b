"""The model side of runs: the runtime and conversation memory, and what a model request is made of."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from atmosphere.contracts.run.v1.run_pb2 import RunSubmission
from atmosphere.dispatch.conversation import ConversationMemory
from atmosphere.dispatch.harness import AgentHarness
from atmosphere.sdk import CacheHint, PromptCache
from atmosphere.sdk.host import AgentSpec
from atmosphere.sdk.runtime import AgentRuntime

log = logging.getLogger("atmosphere.dispatch")

NO_RUNTIME = "No model runtime is available: set LLM_BASE_URL (and LLM_MODEL) to an OpenAI-compatible provider"


def cache_hint(spec: AgentSpec, harness: AgentHarness, run: RunSubmission) -> CacheHint | None:
    """The prompt-cache hint of a run: one key per agent, or per agent and conversation."""
    if harness.prompt_cache is PromptCache.NONE:
        return None
    key = f"atmo:{spec.name}"
    if harness.prompt_cache is PromptCache.AGGRESSIVE:
        key = f"{key}:{run.conversation_id}"
    return CacheHint(harness.prompt_cache, key)


@dataclass(frozen=True)
class ModelSide:
    """The model side every run of this dispatch instance shares (`Run.stream` uses it).

    `runtime` is None when no runtime is usable (runs then end with `runtime.unavailable`);
    `conversation` is the harness's memory (history, facts), None without it.
    """

    runtime: AgentRuntime | None
    conversation: ConversationMemory | None = None
    unavailable: str = NO_RUNTIME
    """What a run is told when there is no runtime: why, in words that name the fix."""

    @property
    def model(self) -> str:
        """The runtime's configured model ("" without a runtime)."""
        return self.runtime.config.model if self.runtime is not None else ""
