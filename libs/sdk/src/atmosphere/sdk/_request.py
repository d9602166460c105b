"""`AiRequest` (what goes to the model) and `AiInterceptor` (how to change it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

from pydantic import BaseModel

from atmosphere.sdk._harness import PromptCache

Role = Literal["system", "user", "assistant", "tool"]
ROLES: frozenset[str] = frozenset(get_args(Role))


@dataclass(frozen=True, slots=True)
class MessageToolCall:
    """A function call an assistant message made (OpenAI's `tool_calls` entry)."""

    call_id: str
    name: str
    arguments: str
    """The arguments as JSON text, as the model wrote them."""


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of the conversation as the model sees it (and as memory keeps and compacts it)."""

    role: Role
    content: str
    tool_calls: tuple[MessageToolCall, ...] = ()
    """An assistant message's calls of the caller's own functions (an OpenAI door's exchange)."""
    tool_call_id: str = ""
    """A `tool` message: the call whose result it is."""

    def __post_init__(self) -> None:
        """Refuse a role the models do not know (a stored or sent message is checked once, here)."""
        if self.role not in ROLES:
            msg = f"unknown message role {self.role!r} (expected one of {sorted(ROLES)})"
            raise ValueError(msg)


@dataclass(frozen=True, slots=True)
class CacheHint:
    """Ask the provider to cache the request's prefix under `key` (sent only where allowed)."""

    policy: PromptCache
    key: str


@dataclass(frozen=True, slots=True)
class AiRequest:
    """One model request before it is sent: immutable, changed through `with_*` copies."""

    message: str
    system_prompt: str = ""
    history: tuple[ChatMessage, ...] = ()
    model: str | None = None
    """Overrides `LLM_MODEL` for this request."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    response_format: type[BaseModel] | None = None
    """Ask for structured output validated against this model."""
    cache_hint: CacheHint | None = None
    """A prompt-cache hint (the harness's CACHE feature seeds one)."""
    continuation: tuple[ChatMessage, ...] = ()
    """What followed the user message in the caller's exchange: the model's calls of the caller's
    own functions and their results (`AiCapability.CLIENT_TOOLS`), sent after it in order."""
    answer_format: Mapping[str, Any] | None = None
    """The caller's own `response_format` (OpenAI's `json_object` or `json_schema` object): the
    model is asked for it as it is, and the answer goes back as the model wrote it."""

    def with_message(self, message: str) -> AiRequest:
        """A copy with another user message."""
        return replace(self, message=message)

    def with_system_prompt(self, system_prompt: str) -> AiRequest:
        """A copy with another system prompt."""
        return replace(self, system_prompt=system_prompt)

    def with_metadata(self, **values: Any) -> AiRequest:
        """A copy with more metadata."""
        return replace(self, metadata={**self.metadata, **values})

    def messages(self) -> list[ChatMessage]:
        """System prompt, history, the user message and the exchange that followed it, in order."""
        head = [ChatMessage("system", self.system_prompt)] if self.system_prompt else []
        return [*head, *self.history, ChatMessage("user", self.message), *self.continuation]


class AiInterceptor:
    """Cross-cutting changes to requests around the model call.

    `pre_process` runs first-to-last before the model call, `post_process` last-to-first after
    it (Atmosphere's FIFO/LIFO convention).
    """

    async def pre_process(self, request: AiRequest) -> AiRequest:
        """Return the request to send (the default changes nothing)."""
        return request

    async def post_process(self, request: AiRequest, response: str) -> None:
        """Observe the final answer text (the default does nothing)."""
