"""The OpenAI-compatible provider as LangChain's `ChatOpenAI` sees it, configured from `RuntimeConfig`.

Every run gets its own `ChatOpenAI` (its retry count is the run's `RetryPolicy`), all of them over one
pair of HTTP clients the runtime owns: the pool is shared, and `aclose` has something to close. The
retries are the openai SDK's: connection failures, 408, 409, 429 and 5xx, honouring `Retry-After`,
`ctx.retry.max_retries` of them (the SDK paces them, not the policy's delays).
"""

from __future__ import annotations

import openai
from langchain_openai import ChatOpenAI
from pydantic import SecretStr

from atmosphere.sdk.runtime import AgentExecutionContext, RuntimeConfig

DEFAULT_MODEL = "default"
NO_API_KEY = "no-key"
"""Sent when no key is configured (a local server): the SDK refuses to run without one, and it must
never fall back to `OPENAI_API_KEY`, which would hand that key to whatever `base_url` says."""


class Provider:
    """The connection to the provider at `config.base_url`, shared by the runs of one runtime."""

    def __init__(self, config: RuntimeConfig) -> None:
        """Configure; the HTTP clients are opened on first use."""
        self._config = config
        self._http: openai.DefaultAsyncHttpxClient | None = None
        self._unused_sync_http: openai.DefaultHttpxClient | None = None

    @property
    def config(self) -> RuntimeConfig:
        """The runtime's configuration (a run's graph reads its `call_timeout`)."""
        return self._config

    def chat_model(self, ctx: AgentExecutionContext) -> ChatOpenAI:
        """The streaming chat model of one run."""
        config = self._config
        generation = config.generation
        http, sync_http = self._clients()
        return ChatOpenAI(
            model=ctx.request.model or config.model or DEFAULT_MODEL,
            base_url=config.base_url,
            api_key=SecretStr(config.api_key or NO_API_KEY),
            streaming=True,
            # Usage is reported per round from the stream's last chunk, which the provider sends only when asked.
            stream_usage=True,
            max_retries=ctx.retry.max_retries,
            timeout=self._timeout(),
            # The whole call is bounded by `call_timeout` instead (`within_deadline`), as in the built-in runtime.
            stream_chunk_timeout=None,
            http_async_client=http,
            http_client=sync_http,
            temperature=generation.temperature,
            # The fields' aliases (what the type checker knows them by): `max_tokens` and `stop`.
            max_completion_tokens=generation.max_tokens,
            top_p=generation.top_p,
            stop_sequences=list(generation.stop) or None,
        )

    async def list_models(self) -> list[str]:
        """`GET <base>/models`."""
        http, _ = self._clients()
        client = openai.AsyncOpenAI(
            base_url=self._config.base_url,
            api_key=self._config.api_key or NO_API_KEY,
            timeout=self._timeout(),
            http_client=http,
        )
        return [model.id async for model in client.models.list()]

    async def aclose(self) -> None:
        """Close the HTTP clients (and let the next use open new ones)."""
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        if self._unused_sync_http is not None:
            self._unused_sync_http.close()
            self._unused_sync_http = None

    def _clients(self) -> tuple[openai.DefaultAsyncHttpxClient, openai.DefaultHttpxClient]:
        if self._http is None:
            self._http = openai.DefaultAsyncHttpxClient(timeout=self._timeout())
        if self._unused_sync_http is None:
            # Never used (runs are async), but without it every `ChatOpenAI` would open a sync client
            # of its own that nobody closes.
            self._unused_sync_http = openai.DefaultHttpxClient(timeout=self._timeout())
        return self._http, self._unused_sync_http

    def _timeout(self) -> openai.Timeout:
        # As the built-in runtime's client. Its separate first-byte deadline has no counterpart here: the
        # wait for the first byte is bounded by the read timeout (the stall timeout) and the call deadline.
        config = self._config
        return openai.Timeout(
            connect=config.connect_timeout,
            read=config.stall_timeout,
            write=config.stall_timeout,
            pool=config.first_byte_timeout,
        )
