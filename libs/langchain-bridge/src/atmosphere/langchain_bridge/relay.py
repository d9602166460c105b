"""Between Atmosphere's messages and LangChain's: the conversation going in, the streamed answer coming out."""

from __future__ import annotations

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, SystemMessage, UsageMetadata
from langchain_core.messages import ChatMessage as RoleMessage

from atmosphere.contracts.run.v1.run_pb2 import RunEvent, ToolCallDelta
from atmosphere.sdk import AiRequest, ChatMessage, StreamingSession, TokenUsage


def conversation(request: AiRequest) -> list[BaseMessage]:
    """The history and the user message, in order (the system prompt is the caller's to place)."""
    return [*(_message(m) for m in request.history), HumanMessage(request.message)]


def _message(message: ChatMessage) -> BaseMessage:
    match message.role:
        case "system":
            return SystemMessage(message.content)
        case "user":
            return HumanMessage(message.content)
        case "assistant":
            return AIMessage(message.content)
        case _:
            # A bare tool result (no call id): sent as the built-in runtime sends it, role and content.
            return RoleMessage(content=message.content, role=message.role)


class Relay:
    """Forwards one run's streamed messages to its session: text, tool-call argument fragments, usage.

    LangGraph's `messages` stream gives each model message once, either chunk by chunk as it streams
    or whole (a model that does not stream, a message a node wrote), so nothing is counted twice.
    """

    def __init__(self, session: StreamingSession) -> None:
        """Relay into `session`."""
        self._session = session
        self._calls: dict[tuple[str | None, int], tuple[str, str]] = {}
        """(message id, tool call index) -> (call id, tool name): only a call's first chunk names them."""
        self._models: dict[str | None, str] = {}
        """Message id -> the model that answered (said in a chunk before the usage chunk)."""

    async def forward(self, message: BaseMessage) -> None:
        """Relay one streamed message (tool results and the input are not the answer: skipped)."""
        if not isinstance(message, AIMessage):
            return
        if text := str(message.text):
            await self._session.send(text)
        if isinstance(message, AIMessageChunk):
            await self._tool_call_fragments(message)
        model = message.response_metadata.get("model_name")
        if isinstance(model, str):
            self._models[message.id] = model
        if message.usage_metadata:
            # One report per model round, as the built-in runtime (a budget counts a step per report).
            await self._session.usage(_usage(message.usage_metadata, self._models.get(message.id, "")))

    async def _tool_call_fragments(self, chunk: AIMessageChunk) -> None:
        for piece in chunk.tool_call_chunks:
            index = piece.get("index") or 0
            key = (chunk.id, index)
            call_id = piece.get("id")
            if call_id:
                self._calls[key] = (call_id, piece.get("name") or "")
            fragment = piece.get("args")
            if fragment:
                call_id, name = self._calls.get(key, (f"call_{index}", ""))
                delta = ToolCallDelta(call_id=call_id, tool_name=name, arguments_fragment=fragment)
                await self._session.emit(RunEvent(tool_call_delta=delta))


def _usage(usage: UsageMetadata, model: str) -> TokenUsage:
    cached = (usage.get("input_token_details") or {}).get("cache_read", 0)
    return TokenUsage(
        input=usage["input_tokens"],
        output=usage["output_tokens"],
        cached_input=cached,
        total=usage["total_tokens"],
        model=model,
    )
