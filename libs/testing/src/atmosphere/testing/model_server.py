"""The scripted model on loopback HTTP: an ASGI app around a `ScriptedModel`, served by uvicorn.

For what cannot take an in-memory transport: services in processes of their own (the
`fake_provider` fixture, the end-to-end stacks) and the benchmarks, which start it as a process
of its own (`python -m atmosphere.testing.model_server --port N`). A client that hangs up mid-answer is
counted in the model's `disconnects`, as a provider would notice it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import uvicorn

from atmosphere.testing.asgi_server import serving_asgi
from atmosphere.testing.model_stream import Answer, Paced
from atmosphere.testing.model_turns import Turn

if TYPE_CHECKING:
    from atmosphere.testing.scripted_model import ScriptedModel

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class ModelServer:
    """The ASGI application: each HTTP request answered by `model.respond`."""

    def __init__(self, model: ScriptedModel) -> None:
        """Serve `model`."""
        self.model = model

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI application."""
        if scope["type"] != "http":
            return
        content = await _body(receive)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        answer = self.model.respond(scope["method"], scope["path"], headers, content)
        if answer.silence and await _hung_up_within(receive, answer.silence):
            self.model.hung_up()
            return
        await _start(send, answer)
        if answer.stream is None:
            await send({"type": "http.response.body", "body": _json_bytes(answer)})
            return
        try:
            await self._stream(answer.stream, send, receive)
        except OSError:
            self.model.hung_up()

    async def _stream(self, stream: Paced, send: Send, receive: Receive) -> None:
        """Send the frames until the last, unless the client hangs up first."""
        watcher = asyncio.create_task(_wait_disconnect(receive))
        pump = asyncio.create_task(_pump(stream, send))
        try:
            await asyncio.wait({watcher, pump}, return_when=asyncio.FIRST_COMPLETED)
            if pump.done():
                pump.result()
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            elif not stream.delivered:  # gone before the end (not merely closing after it)
                self.model.hung_up()
        finally:
            watcher.cancel()
            pump.cancel()
            await asyncio.gather(watcher, pump, return_exceptions=True)


async def _pump(stream: Paced, send: Send) -> None:
    async for frame in stream.frames():
        await send({"type": "http.response.body", "body": frame, "more_body": True})


async def _body(receive: Receive) -> bytes:
    raw = b""
    while True:
        message = await receive()
        raw += bytes(message.get("body", b""))
        if not message.get("more_body"):
            return raw


async def _start(send: Send, answer: Answer) -> None:
    content_type = () if answer.stream is not None else (("content-type", "application/json"),)
    headers = [(k.encode(), v.encode()) for k, v in (*content_type, *answer.headers)]
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})


def _json_bytes(answer: Answer) -> bytes:
    return json.dumps(dict(answer.json or {})).encode()


async def _hung_up_within(receive: Receive, seconds: float) -> bool:
    """Wait `seconds` for nothing; True when the client hung up meanwhile."""
    try:
        async with asyncio.timeout(seconds):
            return await _wait_disconnect(receive)
    except TimeoutError:
        return False


async def _wait_disconnect(receive: Receive) -> bool:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return True


@contextlib.asynccontextmanager
async def serving(model: ScriptedModel) -> AsyncIterator[ScriptedModel]:
    """Serve `model` on 127.0.0.1 on a free port (`model.base_url`) until the context exits."""
    async with serving_asgi(ModelServer(model)) as port:
        model.base_url = f"http://127.0.0.1:{port}/v1"
        yield model


def main(argv: list[str] | None = None) -> int:
    """`python -m atmosphere.testing.model_server`: answer every request alike, forever (for benchmarks)."""
    import argparse  # noqa: PLC0415 - only the command line needs it

    from atmosphere.testing.scripted_model import ScriptedModel  # noqa: PLC0415 - it imports this module

    parser = argparse.ArgumentParser(description="A fake OpenAI-compatible provider answering every request alike.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=int, default=20, help="words per answer")
    parser.add_argument("--chunk-delay", type=float, default=0.005, help="seconds between tokens")
    parser.add_argument("--timestamps", action="store_true", help="each token is its send time in ns")
    args = parser.parse_args(argv)
    text = " ".join(["token"] * args.tokens)
    model = ScriptedModel(default=Turn.text(text, usage=None, chunk_delay=args.chunk_delay, timestamps=args.timestamps))
    uvicorn.run(ModelServer(model), host="127.0.0.1", port=args.port, log_config=None, access_log=False, lifespan="off")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
