"""Run Atmosphere agents on Cohere's v2 Chat API, natively (`CohereAgentRuntime`).

Registered under the `atmosphere.runtimes` entry point `cohere`; dispatch picks it when it is
available (`CO_API_KEY` or `COHERE_BASE_URL` in `RuntimeConfig.extra`) and no runtime of a higher
priority is.
"""

from atmosphere.runtimes.cohere._runtime import CohereAgentRuntime
from atmosphere.runtimes.cohere._settings import (
    API_KEY,
    BASE_URL,
    DEFAULT_MODEL,
    MAX_TOKENS,
    MODEL,
    SDK_BASE_URL,
    SETTINGS,
    CohereSettings,
)

__all__ = [
    "API_KEY",
    "BASE_URL",
    "DEFAULT_MODEL",
    "MAX_TOKENS",
    "MODEL",
    "SDK_BASE_URL",
    "SETTINGS",
    "CohereAgentRuntime",
    "CohereSettings",
]
