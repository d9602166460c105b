"""Turning the `LLM_*` settings into what a runtime needs.

The settings already hold sane values (`LlmSettings` logs and drops or clamps malformed
ones as it reads them), so this is a plain mapping.
"""

from __future__ import annotations

from atmosphere.dispatch.settings import LlmSettings
from atmosphere.sdk.runtime import GenerationOptions, RuntimeConfig


def generation_options(llm: LlmSettings) -> GenerationOptions:
    """The sampling knobs; an unset one leaves the provider's default (and the request body) alone."""
    return GenerationOptions(temperature=llm.temperature, max_tokens=llm.max_tokens, top_p=llm.top_p, stop=llm.stop)


def runtime_config(llm: LlmSettings, *, max_concurrency: int) -> RuntimeConfig:
    """The runtime configuration for this dispatch instance."""
    return RuntimeConfig(
        base_url=llm.base_url.strip() or None,
        api_key=llm.api_key or None,
        model=llm.model,
        generation=generation_options(llm),
        connect_timeout=llm.connect_timeout,
        first_byte_timeout=llm.first_byte_timeout,
        stall_timeout=llm.stall_timeout,
        call_timeout=llm.call_timeout,
        retry_window=llm.retry_window,
        max_concurrency=max_concurrency,
        prompt_cache_key=llm.prompt_cache_key,
    )
