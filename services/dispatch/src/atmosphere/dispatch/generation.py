"""Turning the `LLM_*` settings into what a runtime needs, leniently."""

from __future__ import annotations

import logging

from atmosphere.dispatch.settings import LlmSettings
from atmosphere.sdk.runtime import GenerationOptions, RuntimeConfig

log = logging.getLogger("atmosphere.dispatch")


def _number(name: str, raw: str) -> float | None:
    if not raw.strip():
        return None
    try:
        return float(raw)
    except ValueError:
        log.warning("ignoring %s=%r: not a number", name, raw)
        return None


def generation_options(llm: LlmSettings) -> GenerationOptions:
    """Sanitized knobs: clamped to their ranges, malformed values logged and dropped."""
    temperature = _number("LLM_TEMPERATURE", llm.temperature)
    if temperature is not None and not 0.0 <= temperature <= 2.0:
        log.warning("clamping LLM_TEMPERATURE=%s to [0.0, 2.0]", temperature)
        temperature = min(2.0, max(0.0, temperature))
    top_p = _number("LLM_TOP_P", llm.top_p)
    if top_p is not None and not 0.0 <= top_p <= 1.0:
        log.warning("clamping LLM_TOP_P=%s to [0.0, 1.0]", top_p)
        top_p = min(1.0, max(0.0, top_p))
    max_tokens: int | None = None
    raw_max = _number("LLM_MAX_TOKENS", llm.max_tokens)
    if raw_max is not None:
        if raw_max != int(raw_max) or raw_max <= 0:
            log.warning("ignoring LLM_MAX_TOKENS=%r: not a positive integer", llm.max_tokens)
        else:
            max_tokens = int(raw_max)
    stop = tuple(s.strip() for s in llm.stop.split(",") if s.strip())
    return GenerationOptions(temperature=temperature, max_tokens=max_tokens, top_p=top_p, stop=stop)


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
