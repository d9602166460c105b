"""Run Atmosphere agents on Anthropic's Messages API, natively (`AnthropicAgentRuntime`).

Registered under the `atmosphere.runtimes` entry point `anthropic`; dispatch picks it when it is
available (`ANTHROPIC_API_KEY` or `ANTHROPIC_BASE_URL` in `RuntimeConfig.extra`) and no runtime of
a higher priority is.
"""

from atmosphere.runtimes.anthropic._runtime import AnthropicAgentRuntime
from atmosphere.runtimes.anthropic._settings import (
    API_KEY,
    BASE_URL,
    DEFAULT_MAX_TOKENS,
    DEFAULT_MODEL,
    MAX_TOKENS,
    MODEL,
    SETTINGS,
    AnthropicSettings,
)

__all__ = [
    "API_KEY",
    "BASE_URL",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_MODEL",
    "MAX_TOKENS",
    "MODEL",
    "SETTINGS",
    "AnthropicAgentRuntime",
    "AnthropicSettings",
]
