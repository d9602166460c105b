"""A scripted OpenAI-compatible provider: a real HTTP server on loopback for deterministic tests.

Each `POST /v1/chat/completions` takes the next scripted `Reply`; the script being empty is
a 500 (`script exhausted`), so a test that makes one call too many fails loudly. Every request
body is kept in `requests`; clients that hang up mid-stream are counted in `disconnects`.
An agent's test (`atmosphere.testing.ScriptedModel`) gets the same answers without the server:
its turns become `Reply`s, streamed by the one encoder here (`stream_payloads`).

    provider = FakeProvider()
    provider.script(Reply.error(429, retry_after=1), Reply.text("Hello world", usage=(12, 2)))
    async with provider.serving():
        ...  # point LLM_BASE_URL at provider.base_url
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import uvicorn

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@dataclass(frozen=True)
class ToolCallScript:
    """One tool call the fake model asks for (here and in `atmosphere.testing.ScriptedModel`'s turns)."""

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    """The arguments object, or raw JSON text (to test what a model's malformed JSON does)."""
    call_id: str = ""
    """Empty: `call_<n>` is assigned."""

    @property
    def arguments_json(self) -> str:
        """The arguments as the model sends them."""
        return self.arguments if isinstance(self.arguments, str) else json.dumps(dict(self.arguments))


@dataclass(frozen=True)
class Reply:
    """One scripted response."""

    kind: str
    content: str = ""
    tool_calls: tuple[ToolCallScript, ...] = ()
    status: int = 200
    retry_after: str | None = None
    error_message: str = ""
    usage: tuple[int, int] | None = None
    chunk_delay: float = 0.0
    stall: float = 0.0
    finish: bool = True
    split_arguments: int = 8
    """Tool-call arguments stream in pieces of this many characters."""
    timestamps: bool = False
    """Replace each text piece by its send time in ns plus a space (for latency benches)."""
    chunks: tuple[str, ...] = field(default=())
    finish_reason: str = ""
    """The last chunk's `finish_reason` (default: `tool_calls` or `stop`)."""
    error_code: str | None = None
    error_type: str = "scripted"
    error_param: str | None = None
    silence: float = 0.0
    """Seconds of saying nothing at all (not even headers) before answering."""
    comment_every: float = 0.0
    """Send only SSE comments, one every this many seconds, and never finish."""

    @classmethod
    def text(
        cls,
        text: str,
        *,
        usage: tuple[int, int] | None = None,
        chunk_delay: float = 0.0,
        words: bool = True,
        timestamps: bool = False,
        finish_reason: str = "",
    ) -> Reply:
        """Stream `text` word by word (or character by character) and finish with `finish_reason`."""
        pieces = _words(text) if words else list(text)
        return cls(
            "text",
            content=text,
            usage=usage,
            chunk_delay=chunk_delay,
            chunks=tuple(pieces),
            timestamps=timestamps,
            finish_reason=finish_reason,
        )

    @classmethod
    def tools(cls, *calls: ToolCallScript, usage: tuple[int, int] | None = None, text: str = "") -> Reply:
        """Ask for tool calls (streamed argument fragments) and finish with `tool_calls`."""
        return cls("tools", tool_calls=calls, usage=usage, content=text, chunks=tuple(_words(text)) if text else ())

    @classmethod
    def error(
        cls,
        status: int,
        *,
        message: str = "scripted failure",
        retry_after: str | float | None = None,
        code: str | None = None,
        error_type: str = "scripted",
        param: str | None = None,
    ) -> Reply:
        """Answer with an HTTP error in OpenAI's JSON shape (`code`, `type`, `param` as given)."""
        after = None if retry_after is None else str(retry_after)
        return cls(
            "error",
            status=status,
            error_message=message,
            retry_after=after,
            error_code=code,
            error_type=error_type,
            error_param=param,
        )

    @classmethod
    def stream_error(cls, *, message: str, code: str | None = None, error_type: str = "server_error") -> Reply:
        """A 200 stream whose only event is an error (llama.cpp's way of refusing mid-stream)."""
        return cls("stream_error", error_message=message, error_code=code, error_type=error_type)

    @classmethod
    def raw(cls, *payloads: str) -> Reply:
        """A 200 stream of exactly these `data:` payloads, then `[DONE]` (for hostile chunks)."""
        return cls("raw", chunks=payloads)

    @classmethod
    def empty(cls) -> Reply:
        """A 200 stream with nothing but `data: [DONE]`: no text, no tool call, no finish reason."""
        return cls("empty")

    @classmethod
    def silent(cls, seconds: float) -> Reply:
        """Accept the request, then send no byte (not even headers) for `seconds`, then `ok`."""
        return cls("text", content="ok", chunks=("ok",), silence=seconds)

    @classmethod
    def comments_only(cls, every: float) -> Reply:
        """Headers, then only `: keep-alive` comments every `every` seconds, never an answer."""
        return cls("comments", comment_every=every)

    @classmethod
    def truncated(cls, text: str) -> Reply:
        """Stream `text`, then end the stream with neither `finish_reason` nor `[DONE]`."""
        return cls("text", content=text, chunks=tuple(_words(text)), finish=False)

    @classmethod
    def stalled(cls, text: str, *, seconds: float) -> Reply:
        """Stream `text`, then send nothing for `seconds` before finishing."""
        return cls("text", content=text, chunks=tuple(_words(text)), stall=seconds)

    @classmethod
    def malformed(cls, text: str = "") -> Reply:
        """Stream `text`, then a chunk that is not JSON."""
        return cls("malformed", content=text, chunks=tuple(_words(text)) if text else ())


def _words(text: str) -> list[str]:
    words = text.split(" ")
    return [w if i == len(words) - 1 else w + " " for i, w in enumerate(words) if w or i == len(words) - 1]


@dataclass
class FakeProvider:
    """The scripted provider; `serving()` runs it on 127.0.0.1 with a free port."""

    models: tuple[str, ...] = ("fake-model",)
    replies: list[Reply] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    disconnects: int = 0
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    default: Reply | None = None
    """Answered when the script is empty (benchmarks); None makes an empty script a 500."""
    responder: Callable[[dict[str, Any]], Reply] | None = None
    """Chooses the reply from the request body (the script is ignored): a model whose answer
    depends only on what it is asked, as many concurrent runs (or a re-asked round) need."""
    base_url: str = ""
    """`http://127.0.0.1:<port>/v1`, set while serving."""

    def script(self, *replies: Reply) -> FakeProvider:
        """Append replies to the script."""
        self.replies.extend(replies)
        return self

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[FakeProvider]:
        """Serve until the context exits."""
        config = uvicorn.Config(self, host="127.0.0.1", port=0, log_config=None, access_log=False, lifespan="off")
        server = _QuietServer(config)
        task = asyncio.create_task(server.serve())
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        try:
            yield self
        finally:
            server.should_exit = True
            await task

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI application."""
        if scope["type"] != "http":
            return
        path = scope["path"]
        if scope["method"] == "GET" and path.endswith("/models"):
            body = {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "fake"} for m in self.models]}
            await _json(send, 200, body)
            return
        if scope["method"] != "POST" or not path.endswith("/chat/completions"):
            await _json(send, 404, {"error": {"message": f"no route {path}", "type": "not_found"}})
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = json.loads(raw or b"{}")
        self.requests.append(request)
        self.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        if self.responder is not None:
            await self._reply(self.responder(request), request, send, receive)
            return
        if not self.replies and self.default is None:
            await _json(send, 500, {"error": {"message": "script exhausted", "type": "server_error"}})
            return
        reply = self.replies.pop(0) if self.replies else self.default
        assert reply is not None
        await self._reply(reply, request, send, receive)

    async def _reply(self, reply: Reply, request: dict[str, Any], send: Send, receive: Receive) -> None:
        if reply.silence and await _hung_up_within(receive, reply.silence):
            self._gone()
            return
        if reply.kind == "error":
            headers = [(b"retry-after", reply.retry_after.encode())] if reply.retry_after else []
            await _json(send, reply.status, error_body(reply), headers)
            return
        if not request.get("stream"):
            await _json(send, 200, _completion(reply, request))
            return
        try:
            await self._stream(reply, request, send, receive)
        except OSError:
            self._gone()

    def _gone(self) -> None:
        self.disconnects += 1
        self.disconnected.set()

    async def _stream(self, reply: Reply, request: dict[str, Any], send: Send, receive: Receive) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
            }
        )
        watcher = asyncio.create_task(_wait_disconnect(receive))
        try:
            if reply.kind == "comments":
                await self._comments(reply, send, watcher)
                return
            for event in stream_payloads(reply, request):
                if watcher.done():
                    self._gone()
                    return
                if event == "STALL":
                    await asyncio.wait({watcher}, timeout=reply.stall)
                    continue
                if reply.chunk_delay:
                    await asyncio.sleep(reply.chunk_delay)
                payload = _stamped(event) if reply.timestamps else event
                await send({"type": "http.response.body", "body": f"data: {payload}\n\n".encode(), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()

    async def _comments(self, reply: Reply, send: Send, watcher: asyncio.Task[bool]) -> None:
        while not watcher.done():
            await send({"type": "http.response.body", "body": b": keep-alive\n\n", "more_body": True})
            await asyncio.wait({watcher}, timeout=reply.comment_every)
        self._gone()


async def _hung_up_within(receive: Receive, seconds: float) -> bool:
    """Wait `seconds` for nothing; True when the client hung up meanwhile."""
    try:
        async with asyncio.timeout(seconds):
            return await _wait_disconnect(receive)
    except TimeoutError:
        return False


def error_body(reply: Reply) -> dict[str, Any]:
    """`reply`'s error in OpenAI's JSON shape."""
    return {
        "error": {
            "message": reply.error_message,
            "type": reply.error_type,
            "param": reply.error_param,
            "code": reply.error_code,
        }
    }


def _stamped(event: str) -> str:
    """A text chunk whose content is replaced by the send time in ns (for latency benches)."""
    if not event.startswith("{"):
        return event
    chunk = json.loads(event)
    for choice in chunk.get("choices", []):
        if choice.get("delta", {}).get("content"):
            choice["delta"]["content"] = f"{time.time_ns()} "
    return json.dumps(chunk)


class _QuietServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


async def _wait_disconnect(receive: Receive) -> bool:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return True


async def _json(
    send: Send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), *(headers or [])],
        }
    )
    await send({"type": "http.response.body", "body": payload})


def _chunk(request: dict[str, Any], delta: dict[str, Any], finish: str | None = None) -> str:
    return json.dumps(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": request.get("model", "fake-model"),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


def _usage(reply: Reply, request: dict[str, Any]) -> str | None:
    if reply.usage is None or not (request.get("stream_options") or {}).get("include_usage"):
        return None
    prompt, completion = reply.usage
    return json.dumps(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }
    )


def stream_payloads(reply: Reply, request: dict[str, Any]) -> list[str]:
    """The `data:` payloads of `reply`'s stream for `request`, `[DONE]` last (`STALL` marks a pause).

    The one encoding of a scripted answer: this server sends it, and so does `ScriptedModel`
    through an in-memory transport.
    """
    if reply.kind == "empty":
        return ["[DONE]"]
    if reply.kind == "stream_error":
        return [json.dumps(error_body(reply))]
    if reply.kind == "raw":
        return [*reply.chunks, "[DONE]"]
    events = [_chunk(request, {"role": "assistant", "content": ""})]
    events += [_chunk(request, {"content": piece}) for piece in reply.chunks]
    if reply.kind == "malformed":
        return [*events, "{not json"]
    if reply.stall:
        events.append("STALL")
    for index, call in enumerate(reply.tool_calls):
        arguments = call.arguments_json
        call_id = call.call_id or f"call_{index}"
        first = {"index": index, "id": call_id, "type": "function", "function": {"name": call.name, "arguments": ""}}
        events.append(_chunk(request, {"tool_calls": [first]}))
        step = max(1, reply.split_arguments)
        for start in range(0, len(arguments), step):
            piece = {"index": index, "function": {"arguments": arguments[start : start + step]}}
            events.append(_chunk(request, {"tool_calls": [piece]}))
    if not reply.finish:
        return events
    events.append(_chunk(request, {}, reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")))
    usage = _usage(reply, request)
    if usage:
        events.append(usage)
    return [*events, "[DONE]"]


def _completion(reply: Reply, request: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.call_id or f"call_{i}",
                "type": "function",
                "function": {
                    "name": call.name,
                    "arguments": call.arguments_json,
                },
            }
            for i, call in enumerate(reply.tool_calls)
        ]
    prompt, completion = reply.usage or (0, 0)
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": request.get("model", "fake-model"),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop"),
            }
        ],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


def main(argv: list[str] | None = None) -> int:
    """`python -m atmosphere.testing.fake_provider`: serve one reply forever (for benchmarks)."""
    import argparse  # noqa: PLC0415 - only the command line needs it

    parser = argparse.ArgumentParser(description="A fake OpenAI-compatible provider answering every request alike.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=int, default=20, help="words per answer")
    parser.add_argument("--chunk-delay", type=float, default=0.005, help="seconds between tokens")
    parser.add_argument("--timestamps", action="store_true", help="each token is its send time in ns")
    args = parser.parse_args(argv)
    provider = FakeProvider(
        default=Reply.text(" ".join(["token"] * args.tokens), chunk_delay=args.chunk_delay, timestamps=args.timestamps)
    )
    uvicorn.run(provider, host="127.0.0.1", port=args.port, log_config=None, access_log=False, lifespan="off")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
