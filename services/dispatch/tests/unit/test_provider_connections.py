"""The built-in runtime keeps its connection to the provider from one model call to the next.

Counted where it is real: a TCP relay in front of the scripted provider counts the connections
the runtime opens. Hostile providers: one that keeps the body open after `[DONE]`, one that
sends more after it; the answer is whole either way and the run ends at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from atmosphere.dispatch.runtime.openai import BuiltInAgentRuntime
from atmosphere.dispatch.runtime.provider import MAX_AFTER_DONE
from atmosphere.sdk import AiRequest
from atmosphere.sdk.runtime import RuntimeConfig
from atmosphere.testing import ScriptedModel, Turn
from atmosphere.testing.runtime_contract import Recorder, context

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def listening(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A loopback server running `handler` per connection: its base URL and its connection count."""
    accepted: list[int] = []

    async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(counted, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1", accepted
    finally:
        server.close()
        await server.wait_closed()


def relay_to(base_url: str) -> Handler:
    """Forward bytes both ways to the server at `base_url`."""
    host, port = base_url.removeprefix("http://").split("/", 1)[0].split(":")

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while chunk := await src.read(65536):
                dst.write(chunk)
                await dst.drain()
            dst.close()

        with contextlib.suppress(OSError):
            await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    return relay


async def run_on(runtime: BuiltInAgentRuntime) -> Recorder:
    recorder = Recorder()
    await runtime.execute(context(recorder, AiRequest(message="hi")), recorder.session)
    return recorder


async def test_model_calls_share_one_connection(fake_provider: ScriptedModel) -> None:
    fake_provider.script(*[Turn.text(f"Answer {n}.") for n in range(3)])
    async with listening(relay_to(fake_provider.base_url)) as (url, accepted):
        runtime = BuiltInAgentRuntime(RuntimeConfig(base_url=url, model="m"))
        try:
            answers = [(await run_on(runtime)).text() for _ in range(3)]
        finally:
            await runtime.aclose()
    assert answers == ["Answer 0.", "Answer 1.", "Answer 2."]
    assert len(accepted) == 1


def _chunk(data: str) -> bytes:
    event = f"data: {data}\n\n".encode()
    return f"{len(event):x}\r\n".encode() + event + b"\r\n"


def _text(content: str, finish: str | None = None) -> str:
    delta = {"content": content} if content else {}
    return json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def answering(*, after_done: list[str], end: bool) -> Handler:
    """A provider answering "Whole." then `[DONE]`, then `after_done`; the body ends only if `end`."""

    async def provider(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:  # one answer per request, as long as the client keeps the connection
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            length = next(
                int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
            )
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            writer.write(_chunk(_text("Whole.")) + _chunk(_text("", "stop")) + _chunk("[DONE]"))
            for data in after_done:
                writer.write(_chunk(data))
            if end:
                writer.write(b"0\r\n\r\n")
            await writer.drain()
            if not end:
                await reader.read()  # until the client hangs up
                return

    return provider


async def test_a_body_held_open_after_done_costs_only_its_connection() -> None:
    stall = 30.0
    async with listening(answering(after_done=[], end=False)) as (url, accepted):
        runtime = BuiltInAgentRuntime(RuntimeConfig(base_url=url, model="m", stall_timeout=stall))
        try:
            started = time.monotonic()
            first = await run_on(runtime)
            second = await run_on(runtime)
            took = time.monotonic() - started
        finally:
            await runtime.aclose()
    for recorder in (first, second):
        assert recorder.text() == "Whole."
        assert recorder.terminal().WhichOneof("kind") == "complete"
    assert len(accepted) == 2  # not reusable: let go, and the next call opened another
    # Each call waited out the grace (0.1 s), not the stall timeout: two stalls would take 60 s.
    assert took < stall


@pytest.mark.parametrize(("extra", "connections"), [(3, 1), (MAX_AFTER_DONE + 24, 2)])
async def test_events_after_done_are_read_and_ignored_within_a_bound(extra: int, connections: int) -> None:
    more = [_text("Not part of it.")] * extra
    async with listening(answering(after_done=more, end=True)) as (url, accepted):
        runtime = BuiltInAgentRuntime(RuntimeConfig(base_url=url, model="m"))
        try:
            recorders = [await run_on(runtime) for _ in range(2)]
        finally:
            await runtime.aclose()
    for recorder in recorders:
        assert recorder.text() == "Whole."
        assert recorder.terminal().WhichOneof("kind") == "complete"
    assert len(accepted) == connections  # beyond the bound, the connection is let go
