"""The runtime's settings, read from `RuntimeConfig.extra` (dispatch fills it from the environment).

The keys are the environment variables' names, Anthropic's SDK's own where it has one:

- `ANTHROPIC_API_KEY`: the API key;
- `ANTHROPIC_BASE_URL`: the API's base URL, without `/v1` (default `https://api.anthropic.com`),
  e.g. a gateway's;
- `ANTHROPIC_MODEL`: the model (default `DEFAULT_MODEL`); a request's own `model` wins;
- `ANTHROPIC_MAX_TOKENS`: the answer's token limit of each round, which Anthropic requires
  (default: `LLM_MAX_TOKENS` if set, else `DEFAULT_MAX_TOKENS`).

`LLM_BASE_URL`, `LLM_API_KEY` and `LLM_MODEL` (`RuntimeConfig.base_url`, `api_key`, `model`) are
never used: they name an OpenAI-compatible provider, which this runtime does not speak. The other
`LLM_*` knobs apply: sampling (`temperature`, `top_p`, `stop`), the deadlines and the pool size.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from atmosphere.sdk.runtime import RuntimeConfig

API_KEY = "ANTHROPIC_API_KEY"
BASE_URL = "ANTHROPIC_BASE_URL"
MODEL = "ANTHROPIC_MODEL"
MAX_TOKENS = "ANTHROPIC_MAX_TOKENS"
SETTINGS = (API_KEY, BASE_URL, MODEL, MAX_TOKENS)
"""Every key of `RuntimeConfig.extra` this runtime reads."""

DEFAULT_BASE_URL = "https://api.anthropic.com"
DEFAULT_MODEL = "claude-sonnet-4-6"
DEFAULT_MAX_TOKENS = 4096
"""Accepted by every Claude model: a larger default would be refused by the smaller ones."""

log = logging.getLogger("atmosphere.runtimes.anthropic")


@dataclass(frozen=True, slots=True)
class AnthropicSettings:
    """What the runtime needs to reach Anthropic."""

    api_key: str | None = None
    base_url: str | None = None
    """None: Anthropic's API (`DEFAULT_BASE_URL`)."""
    model: str = DEFAULT_MODEL
    max_tokens: int = DEFAULT_MAX_TOKENS

    @classmethod
    def of(cls, config: RuntimeConfig) -> AnthropicSettings:
        """The settings in `config.extra`; a malformed `ANTHROPIC_MAX_TOKENS` is logged and ignored."""
        extra = config.extra
        return cls(
            api_key=extra.get(API_KEY, "").strip() or None,
            base_url=extra.get(BASE_URL, "").strip() or None,
            model=extra.get(MODEL, "").strip() or DEFAULT_MODEL,
            max_tokens=_max_tokens(extra.get(MAX_TOKENS, "")) or config.generation.max_tokens or DEFAULT_MAX_TOKENS,
        )

    @property
    def configured(self) -> bool:
        """Whether an API key or a base URL is set, and the base URL (if any) is http(s)."""
        if self.base_url is not None and not self.base_url.lower().startswith(("http://", "https://")):
            return False
        return self.api_key is not None or self.base_url is not None


def _max_tokens(text: str) -> int | None:
    if not text.strip():
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        log.warning("%s=%r is not a positive integer; ignoring it", MAX_TOKENS, text)
        return None
    return value
