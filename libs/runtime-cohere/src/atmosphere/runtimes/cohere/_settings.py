"""The runtime's settings, read from `RuntimeConfig.extra` (dispatch fills it from the environment).

The keys are the environment variables' names, Cohere's SDK's own where it has one:

- `CO_API_KEY`: the API key (the SDK's name; it also reads an undocumented `COHERE_API_KEY`,
  which this runtime does not);
- `COHERE_BASE_URL`: the API's base URL, without `/v2` (default `https://api.cohere.com`), e.g.
  a gateway's; the SDK's own name for it, `CO_API_URL`, is read when it is not set (the SDK is
  always given the URL, so it never reads its environment itself);
- `COHERE_MODEL`: the model (default `DEFAULT_MODEL`); a request's own `model` wins;
- `COHERE_MAX_TOKENS`: the answer's token limit of each round (default: `LLM_MAX_TOKENS` if
  set, else none is sent and the model's own maximum applies).

`LLM_BASE_URL`, `LLM_API_KEY` and `LLM_MODEL` (`RuntimeConfig.base_url`, `api_key`, `model`) are
never used: they name an OpenAI-compatible provider, which this runtime does not speak. The other
`LLM_*` knobs apply: sampling (`temperature`, `top_p` as Cohere's `p`, `stop`), the deadlines and
the pool size.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from atmosphere.sdk.runtime import RuntimeConfig

API_KEY = "CO_API_KEY"
BASE_URL = "COHERE_BASE_URL"
SDK_BASE_URL = "CO_API_URL"
"""The SDK's own name for the base URL: read when `BASE_URL` is not set."""
MODEL = "COHERE_MODEL"
MAX_TOKENS = "COHERE_MAX_TOKENS"
SETTINGS = (API_KEY, BASE_URL, SDK_BASE_URL, MODEL, MAX_TOKENS)
"""Every key of `RuntimeConfig.extra` this runtime reads."""

DEFAULT_BASE_URL = "https://api.cohere.com"
DEFAULT_MODEL = "command-a-03-2025"
"""The model of the SDK's own examples: Cohere's current general chat model, with tools and JSON."""

log = logging.getLogger("atmosphere.runtimes.cohere")


@dataclass(frozen=True, slots=True)
class CohereSettings:
    """What the runtime needs to reach Cohere."""

    api_key: str | None = None
    base_url: str | None = None
    """None: Cohere's API (`DEFAULT_BASE_URL`)."""
    base_url_setting: str = BASE_URL
    """The setting the base URL came from (`COHERE_BASE_URL` or the SDK's `CO_API_URL`), to name it."""
    model: str = DEFAULT_MODEL
    max_tokens: int | None = None
    """None: no `max_tokens` is sent (the model's own limit)."""

    @classmethod
    def of(cls, config: RuntimeConfig) -> CohereSettings:
        """The settings in `config.extra`; a malformed `COHERE_MAX_TOKENS` is logged and ignored."""
        extra = config.extra
        base_url_setting = BASE_URL if extra.get(BASE_URL, "").strip() else SDK_BASE_URL
        return cls(
            api_key=extra.get(API_KEY, "").strip() or None,
            base_url=extra.get(base_url_setting, "").strip() or None,
            base_url_setting=base_url_setting,
            model=extra.get(MODEL, "").strip() or DEFAULT_MODEL,
            max_tokens=_max_tokens(extra.get(MAX_TOKENS, "")) or config.generation.max_tokens,
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
