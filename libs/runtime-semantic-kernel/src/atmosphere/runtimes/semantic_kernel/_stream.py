"""From Semantic Kernel to the platform: the conversation in, the streamed text, argument deltas and usage out."""

from __future__ import annotations

from collections.abc import Sequence

from semantic_kernel.connectors.ai.completion_usage import CompletionUsage
from semantic_kernel.contents import ChatHistory, ChatMessageContent, StreamingChatMessageContent
from semantic_kernel.contents.utils.author_role import AuthorRole

from atmosphere.contracts.run.v1.run_pb2 import RunEvent, ToolCallDelta
from atmosphere.sdk import ChatMessage, StreamingSession, TokenUsage

_ROLES = {"system": AuthorRole.SYSTEM, "assistant": AuthorRole.ASSISTANT}


def as_history(messages: Sequence[ChatMessage]) -> ChatHistory:
    """The platform's messages as SK's chat history, in order.

    A `tool` message of the history has no call to answer any more, so it is read as user text.
    """
    return ChatHistory(
        messages=[ChatMessageContent(role=_ROLES.get(m.role, AuthorRole.USER), content=m.content) for m in messages]
    )


class Forwarder:
    """What the agent streams goes to the session as it arrives: text deltas, argument deltas, each round's usage.

    SK's agent yields a model call's text chunk by chunk and, last, a chunk carrying the call's
    usage (`metadata["usage"]`); the usage of a round that asked for tools comes before its
    calls run, as on the built-in runtime.
    """

    def __init__(self, session: StreamingSession, model: str) -> None:
        """Forward into `session`; usage names the answering model, else `model`."""
        self._session = session
        self._model = model

    async def forward(self, message: StreamingChatMessageContent) -> None:
        """Send what `message` adds to the answer, if anything."""
        usage = message.metadata.get("usage")
        if isinstance(usage, CompletionUsage):
            await self._usage(usage, message.ai_model_id or self._model)
        if message.content:
            await self._session.send(message.content)

    async def arguments(self, call_id: str, name: str, fragment: str) -> None:
        """Send a fragment of a tool call's arguments as it streamed."""
        delta = ToolCallDelta(call_id=call_id, tool_name=name, arguments_fragment=fragment)
        await self._session.emit(RunEvent(tool_call_delta=delta))

    async def _usage(self, usage: CompletionUsage, model: str) -> None:
        details = usage.prompt_tokens_details
        input_tokens, output_tokens = usage.prompt_tokens or 0, usage.completion_tokens or 0
        tokens = TokenUsage(
            input=input_tokens,
            output=output_tokens,
            cached_input=(details.cached_tokens or 0) if details is not None else 0,
            total=input_tokens + output_tokens,
            model=model,
        )
        await self._session.usage(tokens)
