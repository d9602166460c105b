"""The platform's model as a LlamaIndex LLM: `OpenAILike` at `LLM_BASE_URL`, sending only what was configured."""

from __future__ import annotations

import sys
from typing import Any

from llama_index.core.memory import ChatMemoryBuffer
from llama_index.llms.openai_like import OpenAILike  # type: ignore[import-untyped]  # ships no py.typed
from openai import AsyncOpenAI

from atmosphere.sdk.runtime import GenerationOptions

NO_API_KEY = "unused"
"""The OpenAI client insists on a key (and would read `OPENAI_API_KEY` for a missing one, then send it
to `LLM_BASE_URL`): a keyless provider gets this instead, and ignores it."""
DEFAULT_CONTEXT_WINDOW = 128_000
"""What LlamaIndex is told of the model's context window (it sizes prompts by it; OpenAILike says 3,900)."""


class PlatformLLM(OpenAILike):  # type: ignore[misc]  # untyped, see the import
    """`OpenAILike` whose requests leave the provider's defaults alone where the platform set nothing.

    The OpenAI LLM always sends a temperature (0.1 unless told), and a `tools: null` to a turn that
    offers none; the built-in runtime sends neither, so neither is sent here.
    """

    sends_temperature: bool = False

    def _get_model_kwargs(self, **kwargs: Any) -> dict[str, Any]:
        sent = {key: value for key, value in super()._get_model_kwargs(**kwargs).items() if value is not None}
        if not self.sends_temperature:
            sent.pop("temperature", None)
        return sent


def platform_llm(model: str, client: AsyncOpenAI, generation: GenerationOptions) -> PlatformLLM:
    """The LLM of one run: chat completions with tools, streamed with usage, through `client`.

    `client` carries the run's retries (the OpenAI client retries 429, 5xx and connection
    failures, honouring `Retry-After`); LlamaIndex's own retry decorator is off (`max_retries=0`),
    it would only add a second, slower retry around the first.
    """
    extra: dict[str, Any] = {"stream_options": {"include_usage": True}}
    if generation.top_p is not None:
        extra["top_p"] = generation.top_p
    if generation.stop:
        extra["stop"] = list(generation.stop)
    settings: dict[str, Any] = {}
    if generation.temperature is not None:
        settings["temperature"] = generation.temperature
    return PlatformLLM(
        model=model,
        api_base=str(client.base_url),
        api_key=client.api_key,
        async_openai_client=client,
        is_chat_model=True,
        is_function_calling_model=True,
        context_window=DEFAULT_CONTEXT_WINDOW,
        max_tokens=generation.max_tokens,
        max_retries=0,
        additional_kwargs=extra,
        sends_temperature=generation.temperature is not None,
        **settings,
    )


def conversation_memory() -> ChatMemoryBuffer:
    """The run's memory: the conversation as given, never cut.

    The platform already bounds the history it sends (its memory's window and compaction);
    LlamaIndex's default memory would cut it again, at three quarters of a context window it can
    only guess, counting tokens with a tokenizer of OpenAI's models.
    """
    return ChatMemoryBuffer(token_limit=sys.maxsize, tokenizer_fn=_uncounted)


def _uncounted(text: str) -> list[str]:
    """No tokens: the memory never counts, since it never cuts."""
    del text
    return []
