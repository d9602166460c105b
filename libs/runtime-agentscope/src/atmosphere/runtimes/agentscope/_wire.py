"""What goes over the OpenAI wire: the platform's plain messages, and tool call ids distinct across a run's rounds."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from agentscope.formatter import OpenAIChatFormatter
from agentscope.message import Msg, ToolCallBlock
from agentscope.model import ChatModelBase, ChatResponse


class PlatformFormatter(OpenAIChatFormatter):
    """AgentScope's chat-completions formatter, its messages sent as the built-in runtime sends them.

    AgentScope names every sender (`"name": "user"`) and sends text as a list of parts; the
    platform's runtimes send plain `{"role", "content"}` messages with string content, and no
    system message when there is no system prompt, so a provider sees the same request whichever
    runtime served the agent.
    """

    async def format(self, msgs: list[Msg]) -> list[dict[str, Any]]:
        """AgentScope's messages, plain."""
        return [plain for message in await super().format(msgs) if (plain := _plain(message)) is not None]


def _plain(message: dict[str, Any]) -> dict[str, Any] | None:
    plain = {key: value for key, value in message.items() if key != "name"}
    content = plain.get("content")
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        plain["content"] = "".join(str(p.get("text", "")) for p in content)
    if plain.get("role") == "system" and not plain.get("content"):
        return None  # an agent without a system prompt sends none
    return plain


class DistinctCallIds:
    """A run's chat model whose tool call ids never repeat an earlier round's.

    AgentScope keeps a whole reply in one message and takes a call whose id already has a result
    for answered: a later round's call under a reused id would never run. OpenAI never reuses an
    id, but an OpenAI-compatible server may number its calls per answer (`call_0`, ...), as the
    platform's scripted model does; such a call is renamed (`call_0-2`) before AgentScope sees it.
    Everything else is the wrapped model's (a proxy: the agent only calls it and reads its fields).
    """

    def __init__(self, model: ChatModelBase) -> None:
        """Wrap `model` for one run."""
        self._model = model
        self._used: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        """The wrapped model's attribute (its name, formatter, context size, token counter)."""
        return getattr(self._model, name)

    async def __call__(self, *args: Any, **kwargs: Any) -> ChatResponse | AsyncGenerator[ChatResponse, None]:
        """The wrapped model's answer, its tool calls renamed where an earlier round used the id."""
        answer = await self._model(*args, **kwargs)
        renamed: dict[str, str] = {}
        if isinstance(answer, ChatResponse):
            self._rename(answer, renamed)
            self._used.update(renamed.values())
            return answer
        return self._renamed(answer, renamed)

    async def _renamed(
        self, chunks: AsyncGenerator[ChatResponse, None], renamed: dict[str, str]
    ) -> AsyncGenerator[ChatResponse, None]:
        try:
            async for chunk in chunks:
                self._rename(chunk, renamed)
                yield chunk
        finally:
            self._used.update(renamed.values())
            await chunks.aclose()  # the model's own cleanup closes the provider's stream

    def _rename(self, chunk: ChatResponse, renamed: dict[str, str]) -> None:
        for block in chunk.content:
            if isinstance(block, ToolCallBlock):
                if block.id not in renamed:
                    renamed[block.id] = self._fresh(block.id)
                block.id = renamed[block.id]

    def _fresh(self, call_id: str) -> str:
        """`call_id`, or the first `call_id-<n>` no earlier round used."""
        fresh, n = call_id, 1
        while fresh in self._used:
            n += 1
            fresh = f"{call_id}-{n}"
        return fresh
