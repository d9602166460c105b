"""`PlatformLLM`: CrewAI's own OpenAI provider, pointed at `LLM_BASE_URL` and run on the run's loop.

CrewAI 1.15 reaches an OpenAI-compatible server through its native provider
(`crewai.llms.providers.openai.completion.OpenAICompletion`, the OpenAI SDK; LiteLLM is not
installed and not needed). This subclass keeps its request building, streaming, tool-call
parsing, usage accounting and events, and changes where and how a call runs:

- CrewAI calls `call` from a worker thread; the call is made with `acall` on the run's loop
  (`Bridge`), over the engine's one `AsyncOpenAI` client (one connection pool, the run's retry
  policy), so cancelling the run closes its HTTP stream;
- it streams (`stream=True`, with `stream_options.include_usage`), always on chat completions
  (`custom_openai`: never the Responses API, which few providers speak);
- the OpenAI client's retries are the only ones (429, 5xx, connection failures, honouring
  `Retry-After`, up to `RetryPolicy.max_retries`): CrewAI's own rate-limit retry is not wrapped
  around these calls;
- an Atmosphere agent's tools go out with the schema the app declared (not CrewAI's strict
  rewrite), and its `ToolLoop` sees each answer before CrewAI runs the answer's tools;
- CrewAI's stop words (`Observation:`, for its text-based tool protocol) are not applied: tool
  calls are native, and the platform's own `stop` goes in the request;
- a tool result message carries only what chat completions define (CrewAI adds `name`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from crewai.llms.providers.openai.completion import OpenAICompletion
from crewai.utilities.message_utils import message_content_text
from openai import AsyncOpenAI, OpenAI, Timeout
from pydantic import ConfigDict, Field, PrivateAttr
from typing_extensions import override

from atmosphere.runtimes.crewai._bridge import Bridge
from atmosphere.runtimes.crewai._tools import Incident, ToolLoop, ToolLoopExhaustedError
from atmosphere.sdk.runtime import RuntimeConfig, ToolSpec

NO_API_KEY = "unused"
"""The OpenAI client insists on a key (and would read `OPENAI_API_KEY` for a missing one, then send it
to `LLM_BASE_URL`): a keyless provider gets this instead, and ignores it."""


class ProviderClients:
    """The engine's OpenAI clients: one connection pool for every run (each run sets its own retries)."""

    def __init__(self, config: RuntimeConfig) -> None:
        """Reach `config.base_url` with `config.api_key`; nothing is opened before the first call."""
        self._config = config
        self._async: AsyncOpenAI | None = None
        self._sync: OpenAI | None = None

    def _settings(self) -> dict[str, Any]:
        config = self._config
        timeout = Timeout(
            config.call_timeout,
            connect=config.connect_timeout,
            read=config.stall_timeout,
            write=config.stall_timeout,
            pool=config.first_byte_timeout,
        )
        return {"base_url": config.base_url, "api_key": config.api_key or NO_API_KEY, "timeout": timeout}

    @property
    def async_client(self) -> AsyncOpenAI:
        """The client every run's model calls use."""
        if self._async is None:
            self._async = AsyncOpenAI(**self._settings())
        return self._async

    @property
    def sync_client(self) -> OpenAI:
        """For a call CrewAI makes synchronously on the loop's own thread, where it cannot be handed to the loop."""
        if self._sync is None:
            self._sync = OpenAI(**self._settings())
        return self._sync

    async def aclose(self) -> None:
        """Close both pools."""
        if self._async is not None:
            await self._async.close()
            self._async = None
        if self._sync is not None:
            self._sync.close()
            self._sync = None


def _unwrapped(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method` without the rate-limit retry CrewAI wraps around a provider's `call`/`acall` (`functools.wraps`)."""
    inner: Callable[..., Any] = getattr(method, "__wrapped__", method)
    return inner


_OPENAI_CALL = _unwrapped(OpenAICompletion.call)
_OPENAI_ACALL = _unwrapped(OpenAICompletion.acall)


class PlatformLLM(OpenAICompletion):
    """The platform's model as a CrewAI LLM (see the module)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, populate_by_name=True)

    clients: ProviderClients | None = Field(default=None, exclude=True)

    _bridge: Bridge | None = PrivateAttr(default=None)
    _incident: Incident | None = PrivateAttr(default=None)
    _specs: dict[str, ToolSpec] = PrivateAttr(default_factory=dict)
    _tool_loop: ToolLoop | None = PrivateAttr(default=None)

    def attach(
        self,
        bridge: Bridge,
        incident: Incident,
        specs: tuple[ToolSpec, ...] = (),
        tool_loop: ToolLoop | None = None,
    ) -> PlatformLLM:
        """Bind the model to one run: its bridge, its incident, its declared tools and tool loop."""
        self._bridge, self._incident = bridge, incident
        self._specs = {spec.name: spec for spec in specs}
        self._tool_loop = tool_loop
        return self

    @override
    def _build_async_client(self) -> Any:
        if self.clients is None:
            return super()._build_async_client()
        return self.clients.async_client.with_options(max_retries=self.max_retries)

    @override
    def _build_sync_client(self) -> Any:
        if self.clients is None:
            return super()._build_sync_client()
        return self.clients.sync_client.with_options(max_retries=self.max_retries)

    @override
    def call(
        self,
        messages: Any,
        tools: list[dict[str, Any]] | None = None,
        callbacks: list[Any] | None = None,
        available_functions: dict[str, Any] | None = None,
        from_task: Any = None,
        from_agent: Any = None,
        response_model: Any = None,
    ) -> Any:
        """Make the call on the run's loop and wait for it (CrewAI calls this from a worker thread)."""
        arguments = (messages, tools, callbacks, available_functions, from_task, from_agent, response_model)
        bridge = self._bridge
        if bridge is None or bridge.loop_thread:
            # Called on the loop's own thread, it cannot wait for the loop: the synchronous client answers.
            return self._counted(lambda: _OPENAI_CALL(self, *self._offered(arguments)))
        return bridge.call(lambda: self.acall(*arguments))

    call._crewai_rate_limit_wrapped = True  # type: ignore[attr-defined]

    @override
    async def acall(
        self,
        messages: Any,
        tools: list[dict[str, Any]] | None = None,
        callbacks: list[Any] | None = None,
        available_functions: dict[str, Any] | None = None,
        from_task: Any = None,
        from_agent: Any = None,
        response_model: Any = None,
    ) -> Any:
        """One model round, streamed, counted by the run's tool loop."""
        arguments = (messages, tools, callbacks, available_functions, from_task, from_agent, response_model)
        try:
            answer = await _OPENAI_ACALL(self, *self._offered(arguments))
        except Exception as exc:
            if self._incident is not None:
                self._incident.record(exc)
            raise
        return self._count(answer)

    acall._crewai_rate_limit_wrapped = True  # type: ignore[attr-defined]

    def _offered(self, arguments: tuple[Any, ...]) -> tuple[Any, ...]:
        """The call's arguments, without the tools once a lenient tool loop withdrew them."""
        if self._tool_loop is not None and not self._tool_loop.offered:
            return (arguments[0], None, *arguments[2:])
        return arguments

    def _counted(self, make: Callable[[], Any]) -> Any:
        try:
            answer = make()
        except Exception as exc:
            if self._incident is not None:
                self._incident.record(exc)
            raise
        return self._count(answer)

    def _count(self, answer: Any) -> Any:
        """Let the tool loop see an answer that asks for tools (a list of tool calls) before CrewAI runs them."""
        if self._tool_loop is not None and isinstance(answer, list) and answer:
            try:
                self._tool_loop.answered_with_tools()
            except ToolLoopExhaustedError as exc:
                if self._incident is not None:
                    self._incident.record(exc, stop=True)
                raise
        return answer

    @override
    def _convert_tools_for_interference(self, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        converted = super()._convert_tools_for_interference(tools)
        for tool in converted:
            spec = self._specs.get(tool.get("function", {}).get("name", ""))
            if spec is not None:
                # The schema goes out as the app declared it, not rewritten for strict mode.
                tool["function"] = {"name": spec.name, "description": spec.description, "parameters": spec.parameters}
        return converted

    @override
    def _format_messages(self, messages: Any, *, file_api: str | None = None) -> Any:
        formatted = super()._format_messages(messages, file_api=file_api)
        return [
            {k: v for k, v in message.items() if k != "name"} if message.get("role") == "tool" else message
            for message in formatted
        ]

    @override
    def get_input_tokens_count(
        self, messages: Any, tools: list[dict[str, Any]] | None = None, response_model: Any = None
    ) -> int:
        """CrewAI's own estimate for a server that counts no tokens (one a four characters), without its warning.

        CrewAI checks a hosted agent's context window before each call and logs a warning each
        time it has to estimate: on every call of every run, for any OpenAI-compatible server.
        """
        del tools, response_model
        if isinstance(messages, str):
            return (len(messages) + 3) // 4
        return (sum(len(message_content_text(message)) for message in messages) + 3) // 4

    @override
    def supports_stop_words(self) -> bool:
        """No: CrewAI's stop words belong to its text-based tool protocol, and tool calls here are native."""
        return False
