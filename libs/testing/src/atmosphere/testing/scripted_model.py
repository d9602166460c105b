"""The model of an agent's test: each request is answered with the next scripted `Turn`.

`ScriptedModel` is the fake provider (`atmosphere.testing.fake_provider`) without the HTTP
server: dispatch's built-in runtime reaches it through an in-memory `httpx` transport, and
each turn is streamed with the fake provider's own encoding (`stream_payloads`), so the two
fakes answer alike. No socket is opened: nothing a test scripts can leak to a real provider.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import BaseModel

from atmosphere.sdk.errors import UserError
from atmosphere.testing.fake_provider import Reply, ToolCallScript, error_body, stream_payloads

REFUSED = (
    "Model requests are refused in atmosphere.testing: script the model with ScriptedModel(...) "
    "or pass allow_model_requests=True with a RuntimeConfig"
)


@dataclass(frozen=True, slots=True)
class Turn:
    """What the model answers to one request; build one with the class methods."""

    content: str = ""
    """The answer text (streamed word by word)."""
    calls: tuple[ToolCallScript, ...] = ()
    """The tool calls asked for."""
    status: int = 200
    """Not 200: the provider fails the request with this HTTP status and `error_message`."""
    error_message: str = ""
    usage: tuple[int, int] = (10, 5)
    """(input, output) tokens reported for the round."""
    finish_reason: str = ""
    """Default: `tool_calls` when there are calls, else `stop`; `length` cuts the answer short."""

    @classmethod
    def text(cls, text: str, *, usage: tuple[int, int] = (10, 5), finish_reason: str = "") -> Turn:
        """Answer with `text`."""
        return cls(content=text, usage=usage, finish_reason=finish_reason)

    @classmethod
    def tool_call(cls, name: str, /, **arguments: Any) -> Turn:
        """Ask for one call of tool `name` with `arguments`."""
        return cls(calls=(ToolCallScript(name, arguments),))

    @classmethod
    def tool_calls(cls, *calls: ToolCallScript, text: str = "") -> Turn:
        """Ask for several tool calls at once (they run concurrently), optionally after some text."""
        return cls(content=text, calls=tuple(calls))

    @classmethod
    def structured(cls, value: BaseModel | Mapping[str, Any]) -> Turn:
        """Answer with `value` as JSON: the structured output of an agent with `response_format`."""
        text = value.model_dump_json() if isinstance(value, BaseModel) else json.dumps(dict(value))
        return cls(content=text)

    @classmethod
    def error(cls, message: str, *, status: int = 400) -> Turn:
        """The provider refuses the request with `status` (429 and 5xx are retried per the agent's RetryPolicy)."""
        if status < 400:
            msg = f"an error turn needs an HTTP error status (>= 400), got {status}"
            raise UserError(msg)
        return cls(status=status, error_message=message)

    def reply(self) -> Reply:
        """The fake provider's reply that streams this turn."""
        if self.status != 200:
            return Reply.error(self.status, message=self.error_message)
        words = Reply.text(self.content).chunks if self.content else ()
        kind = "tools" if self.calls else "text"
        return Reply(
            kind,
            content=self.content,
            tool_calls=self.calls,
            usage=self.usage,
            chunks=words,
            finish_reason=self.finish_reason,
        )


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One request the runtime sent to the model, as a script function sees it."""

    messages: tuple[Mapping[str, Any], ...]
    """The OpenAI-style messages: system, history, user, assistant tool calls, tool results."""
    tools: tuple[str, ...]
    """The names of the tools offered (user tools and the harness's built-in ones)."""
    body: Mapping[str, Any]
    """The whole request body (model, response_format, stream options, ...)."""

    @property
    def last_tool_result(self) -> str | None:
        """The content of the newest `tool` message, or None."""
        for message in reversed(self.messages):
            if message.get("role") == "tool":
                return str(message.get("content"))
        return None


Script = Callable[[ModelRequest], Turn]


class ScriptedModel:
    """A model that answers from a script: a list of turns, or a function of the request.

    Every request is kept in `requests`. A request past the end of the script fails the run
    with an error naming the request number (a test that makes one call too many fails loudly).
    """

    def __init__(self, *turns: Turn | str, function: Script | None = None) -> None:
        """Answer with `turns` in order (a plain string is a text turn), or with `function(request)`."""
        if turns and function is not None:
            msg = "give ScriptedModel either turns or a function, not both"
            raise UserError(msg)
        self._turns = [Turn.text(t) if isinstance(t, str) else t for t in turns]
        self._function = function
        self.requests: list[ModelRequest] = []

    def _next(self, request: ModelRequest) -> Turn:
        self.requests.append(request)
        if self._function is not None:
            return self._function(request)
        index = len(self.requests) - 1
        if index >= len(self._turns):
            return Turn.error(
                f"the scripted model has no turn left for request {index + 1} (it has {len(self._turns)})"
            )
        return self._turns[index]

    async def handle(self, http: httpx.Request) -> httpx.Response:
        """Answer one chat-completions request of the runtime (the `httpx.MockTransport` handler)."""
        if not http.url.path.endswith("/chat/completions"):
            return _error_response(404, f"the scripted model serves chat completions only, not {http.url.path}")
        body = json.loads(http.content)
        tools = tuple(t["function"]["name"] for t in body.get("tools", ()))
        try:
            turn = self._next(ModelRequest(messages=tuple(body["messages"]), tools=tools, body=body))
        except Exception as exc:  # a bug in the test's script: shown in the run's error, never retried
            return _error_response(400, f"the script function raised {type(exc).__name__}: {exc}")
        reply = turn.reply()
        if reply.kind == "error":
            return httpx.Response(reply.status, json=error_body(reply))
        stream = "".join(f"data: {payload}\n\n" for payload in stream_payloads(reply, body))
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=stream.encode())


def refuse(_request: httpx.Request) -> httpx.Response:
    """The transport's answer when no model is scripted: every request refused, nothing sent out."""
    return _error_response(403, REFUSED)


def _error_response(status: int, message: str) -> httpx.Response:
    return httpx.Response(status, json=error_body(Reply.error(status, message=message)))
