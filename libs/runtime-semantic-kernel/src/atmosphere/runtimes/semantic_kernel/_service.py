"""The platform's model as a Semantic Kernel chat service: SK's OpenAI connector, observed and, for built runs, shaped.

SK's agent drops every streamed chunk that carries a function call, so a tool call's argument
deltas are forwarded here, from the connector's stream, as they arrive (`DeltaSink`). For a run
built from `ctx` (`SpecOffer`), the request goes out as the built-in runtime sends it: the
tools as the app declared them (see `_tools`), none once a lenient tool loop withdrew them, and
no `name` field on the messages (SK names each with the agent's name).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from openai import AsyncOpenAI
from pydantic import PrivateAttr
from semantic_kernel.connectors.ai.function_call_choice_configuration import FunctionCallChoiceConfiguration
from semantic_kernel.connectors.ai.function_choice_type import FunctionChoiceType
from semantic_kernel.connectors.ai.open_ai import OpenAIChatCompletion, OpenAIChatPromptExecutionSettings
from semantic_kernel.connectors.ai.prompt_execution_settings import PromptExecutionSettings
from semantic_kernel.contents import ChatHistory, FunctionCallContent, StreamingChatMessageContent

from atmosphere.runtimes.semantic_kernel._tools import SpecOffer

DeltaSink = Callable[[str, str, str], Awaitable[None]]
"""Receives a fragment of a tool call's arguments: call id, tool name, fragment."""
SettingsCallback = Callable[[FunctionCallChoiceConfiguration, PromptExecutionSettings, FunctionChoiceType], None]


class PlatformChatCompletion(OpenAIChatCompletion):
    """`OpenAIChatCompletion` at `LLM_BASE_URL` for one run."""

    _deltas: DeltaSink | None = PrivateAttr(default=None)
    _offer: SpecOffer | None = PrivateAttr(default=None)

    def __init__(
        self, *, model: str, client: AsyncOpenAI, deltas: DeltaSink | None = None, offer: SpecOffer | None = None
    ) -> None:
        """`model` through `client`; argument deltas to `deltas`; `offer`: the tools of a run built from `ctx`."""
        super().__init__(ai_model_id=model, async_client=client)
        self._deltas = deltas
        self._offer = offer

    def _update_function_choice_settings_callback(self) -> SettingsCallback:
        """A built run's tools as declared; a hosted agent's as SK declares its kernel functions."""
        offer = self._offer
        if offer is None:
            return super()._update_function_choice_settings_callback()

        def offer_specs(
            configuration: FunctionCallChoiceConfiguration,
            settings: PromptExecutionSettings,
            choice: FunctionChoiceType,
        ) -> None:
            del configuration  # the run's kernel has no functions: its tools are the specs
            if offer.specs and isinstance(settings, OpenAIChatPromptExecutionSettings):
                settings.tool_choice = str(choice.value)
                settings.tools = offer.definitions()

        return offer_specs

    def _prepare_chat_history_for_request(
        self, chat_history: ChatHistory, role_key: str = "role", content_key: str = "content"
    ) -> Any:
        """The messages as SK sends them; a built run's without the agent's name on each."""
        messages = super()._prepare_chat_history_for_request(chat_history, role_key, content_key)
        if self._offer is None:
            return messages
        return [{key: value for key, value in message.items() if key != "name"} for message in messages]

    async def _inner_get_streaming_chat_message_contents(
        self, chat_history: ChatHistory, settings: PromptExecutionSettings, function_invoke_attempt: int = 0
    ) -> AsyncGenerator[list[StreamingChatMessageContent], Any]:
        """One streamed model call (no tools once the loop withdrew them), its argument deltas forwarded first."""
        if self._offer is not None and self._offer.loop.withdrawn:
            self._reset_function_choice_settings(settings)
        calls: dict[int, tuple[str, str]] = {}  # the tool call of each index of this answer: (call id, tool name)
        stream = super()._inner_get_streaming_chat_message_contents(chat_history, settings, function_invoke_attempt)
        async for messages in stream:
            if self._deltas is not None:
                for message in messages:
                    await self._forward_arguments(message, calls)
            yield messages

    async def _forward_arguments(self, message: StreamingChatMessageContent, calls: dict[int, tuple[str, str]]) -> None:
        assert self._deltas is not None
        for item in message.items:
            if not isinstance(item, FunctionCallContent):
                continue
            index = item.index or 0
            if item.id and item.name:
                calls[index] = (item.id, item.name)  # a call's first chunk names it; the rest carry its index
            fragment = item.arguments
            if isinstance(fragment, str) and fragment and index in calls:
                await self._deltas(*calls[index], fragment)
