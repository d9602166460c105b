"""The ADK runtime's settings, read from `RuntimeConfig.extra` (dispatch fills it from the environment).

The keys are the environment variables' names, `google-genai`'s own where it has one:

- `GOOGLE_API_KEY`: the Gemini API key (`GEMINI_API_KEY` is read when it is not set, as
  `google-genai` does);
- `GOOGLE_GEMINI_BASE_URL`: the Gemini API's base URL, without `/v1beta` (default
  `https://generativelanguage.googleapis.com`), e.g. a gateway's — the variable `google-genai`
  itself honours;
- `GEMINI_MODEL`: the model of an agent that names none (default `DEFAULT_MODEL`, ADK's own
  default); a request's own `model` wins.

`LLM_BASE_URL`, `LLM_API_KEY` and `LLM_MODEL` are never used: they name an OpenAI-compatible
provider, which this runtime does not speak. The other `LLM_*` knobs apply: sampling
(`temperature`, `top_p`, `max_tokens`, `stop`), the deadlines and the pool size.
"""

from __future__ import annotations

from dataclasses import dataclass

from atmosphere.sdk.runtime import RuntimeConfig

API_KEY = "GOOGLE_API_KEY"
GEMINI_API_KEY = "GEMINI_API_KEY"
BASE_URL = "GOOGLE_GEMINI_BASE_URL"
MODEL = "GEMINI_MODEL"
SETTINGS = (API_KEY, GEMINI_API_KEY, BASE_URL, MODEL)
"""Every key of `RuntimeConfig.extra` this runtime reads."""

DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com"
DEFAULT_MODEL = "gemini-3.5-flash"
"""ADK 2.13's own default model (`LlmAgent.DEFAULT_MODEL`), for an agent that names none."""


@dataclass(frozen=True, slots=True)
class GeminiSettings:
    """What the runtime needs to reach the Gemini API."""

    api_key: str | None = None
    base_url: str | None = None
    """None: Google's API (`DEFAULT_BASE_URL`)."""
    model: str = DEFAULT_MODEL

    @classmethod
    def of(cls, config: RuntimeConfig) -> GeminiSettings:
        """The settings in `config.extra`."""
        extra = config.extra
        return cls(
            api_key=extra.get(API_KEY, "").strip() or extra.get(GEMINI_API_KEY, "").strip() or None,
            base_url=extra.get(BASE_URL, "").strip() or None,
            model=extra.get(MODEL, "").strip() or DEFAULT_MODEL,
        )

    @property
    def configured(self) -> bool:
        """Whether an API key or a base URL is set, and the base URL (if any) is http(s)."""
        if self.base_url is not None and not self.base_url.lower().startswith(("http://", "https://")):
            return False
        return self.api_key is not None or self.base_url is not None
